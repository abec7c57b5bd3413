#!/bin/sh
# Fills fuzz/corpus/<target>/ with the seeds the robustness suite mutates: heads of the real
# transcripts and the claude-trace capture in ../shared/realdata, and the shipped files.
# Run from the repository root: sh fuzz/seed-corpus.sh
set -eu
realdata=../shared/realdata
c=fuzz/corpus
mkdir -p "$c"
for t in recording transcript request_log claude_trace shapes model_table calibration strategy_toml strategy_yaml baseline sweep_csv trace scenario; do
  mkdir -p "$c/$t"
done
head -c 24000 recordings/entireio-7662d755ef9f-2.jsonl > "$c/recording/entireio"
for f in "$realdata"/transcripts/*/*.full.jsonl; do
  head -n 40 "$f" | head -c 64000 > "$c/transcript/$(basename "$f")"
done
# 2.1.332 transcripts with recorded wire requests (api-request, -shape, -blob records).
for d in tests/data/api-requests/*/; do
  cp "$d"00000000-0000-4000-8000-000000000001.jsonl "$c/transcript/api-requests-$(basename "$d")"
done
head -n 6 "$realdata/api_captures/claude-trace/test-traffic.jsonl" > "$c/claude_trace/test-traffic"
head -n 20 reports/claude-trace/trace.jsonl > "$c/trace/claude-trace"
head -n 20 reports/real-session/trace.jsonl > "$c/trace/real-session"
cp tests/conformance/*.real-shapes.json "$c/shapes/"
cp data/models.toml "$c/model_table/"
cp data/calibration.json "$c/calibration/"
cp reports/sweep/sweep.csv "$c/sweep_csv/"
cp scenarios/*.yaml "$c/scenario/"
printf 'name = "seed"\nttl_main = "1h"\n' > "$c/strategy_toml/seed.toml"
printf 'name: seed\nttl_main: 1h\n' > "$c/strategy_yaml/seed.yaml"
printf '{"version": 1, "scenarios": {}}\n' > "$c/baseline/empty.json"
# A request log: `ctxsim import` of the capture writes one.
if [ -x target/debug/ctxsim ]; then
  target/debug/ctxsim import --quiet --from claude-trace "$c/claude_trace/test-traffic" -o "$c/request_log/test-traffic.jsonl"
  cp "$c/request_log/test-traffic.jsonl" "$c/shapes/"
  # The JSON-array form of a request log (bare bodies, pretty-printed, as `analyze` reads it
  # with `analyze::read_array`, which names each element's line).
  if command -v jq >/dev/null; then
    jq -s '[.[].body]' "$c/request_log/test-traffic.jsonl" > "$c/request_log/test-traffic-array.json"
  else
    echo "seed-corpus.sh: jq not found, no JSON-array request log seed" >&2
  fi
else
  echo "seed-corpus.sh: target/debug/ctxsim not built, no request log seeds" >&2
fi
