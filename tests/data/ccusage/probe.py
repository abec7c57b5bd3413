import json, os, sys, itertools
root = sys.argv[1]
models = ["claude-fable-5","claude-mythos-5","claude-mythos-preview","claude-opus-5","claude-opus-4-8","claude-opus-4-7","claude-opus-4-6","claude-opus-4-5-20251101","claude-opus-4-1-20250805","claude-opus-4-20250514","claude-sonnet-5","claude-sonnet-4-6","claude-sonnet-4-5-20250929","claude-sonnet-4-20250514","claude-3-7-sonnet-20250219","claude-3-5-sonnet-20241022","claude-haiku-4-5-20251001","claude-3-5-haiku-20241022","claude-3-haiku-20240307","claude-3-opus-20240229","claude-opus-5-5","claude-sonnet-5-5","claude-haiku-5-5","claude-fable-5-1","claude-fable-5-2","claude-mythos-5-1"]
M=1_000_000
variants = {
 "in": dict(input_tokens=M), "in100k": dict(input_tokens=100_000),
 "out": dict(output_tokens=M), "out100k": dict(output_tokens=100_000),
 "w5m": dict(cache_creation_input_tokens=M, cache_creation=dict(ephemeral_5m_input_tokens=M, ephemeral_1h_input_tokens=0)),
 "w1h": dict(cache_creation_input_tokens=M, cache_creation=dict(ephemeral_5m_input_tokens=0, ephemeral_1h_input_tokens=M)),
 "w1h100k": dict(cache_creation_input_tokens=100_000, cache_creation=dict(ephemeral_5m_input_tokens=0, ephemeral_1h_input_tokens=100_000)),
 "wnosplit": dict(cache_creation_input_tokens=M),
 "rd": dict(cache_read_input_tokens=M), "rd100k": dict(cache_read_input_tokens=100_000),
 "mix": dict(input_tokens=150_000, cache_read_input_tokens=150_000, output_tokens=1000),
 "fast_in": dict(input_tokens=100_000, speed="fast"), "fast_out": dict(output_tokens=100_000, speed="fast"),
 "fast_rd": dict(cache_read_input_tokens=100_000, speed="fast"),
 "fast_w1h": dict(cache_creation_input_tokens=100_000, cache_creation=dict(ephemeral_5m_input_tokens=0, ephemeral_1h_input_tokens=100_000), speed="fast"),
 "geo_us": dict(input_tokens=100_000, inference_geo="us"), "geo_global": dict(input_tokens=100_000, inference_geo="global"),
 "batch": dict(input_tokens=100_000, service_tier="batch"), "priority": dict(input_tokens=100_000, service_tier="priority"),
}
n=0
for m in models:
  d=os.path.join(root,"projects","probe-"+m); os.makedirs(d, exist_ok=True)
  for v,u in variants.items():
    n+=1
    sid=f"{m}__{v}"
    base=dict(input_tokens=0,output_tokens=0,cache_creation_input_tokens=0,cache_read_input_tokens=0); base.update(u)
    e={"type":"assistant","timestamp":"2026-08-01T00:00:00.000Z","sessionId":sid,"requestId":f"req_{n}","cwd":"/p","version":"2.1.200","uuid":f"u{n}","parentUuid":None,
       "message":{"id":f"msg_{n}","type":"message","role":"assistant","model":m,"content":[{"type":"text","text":"x"}],"stop_reason":"end_turn","usage":base}}
    open(os.path.join(d,sid+".jsonl"),"w").write(json.dumps(e,separators=(",",":"))+"\n")
