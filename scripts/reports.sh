#!/usr/bin/env bash
# The main job: run the shipped scenarios and recordings, measure every request, and write the
# example reports under reports/. Real sessions from ../shared/realdata are used when present.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(scripts/build-dist.sh)
realdata=../shared/realdata

"$bin" run scenarios --out reports/scenarios --quiet
# The shipped recording through the agent as recorded (the one engine; the summary says
# `"engine": "agent"`).
"$bin" replay recordings/*.jsonl --trace reports/real-session/trace.jsonl --format json > reports/real-session/summary.json
"$bin" report reports/real-session/trace.jsonl --out reports/real-session --quiet

# Presets side by side on the long-context and cache-break scenarios and on the real session
# (the recorded session runs through the agent under each preset: `--engine agent`, the only
# engine). The outputs name the engine.
"$bin" compare --engine agent scenarios/autocompact-200k.yaml scenarios/compaction-fork-shares-cache.yaml \
  scenarios/context-editing.yaml scenarios/time-microcompact.yaml scenarios/tool-result-budget.yaml \
  scenarios/break-thinking-cleared-after-idle.yaml scenarios/idle-gap.yaml recordings/*.jsonl \
  --strategies claude-code,claude-code-1h,claude-code-summary-only,context-editing,codex,opencode,observation-masking,cline \
  --out reports/compare --quiet --no-progress

# A small grid: main-lane TTL × autocompact buffer × tool uses kept by context editing (the
# recorded session through the agent, the default engine, named in sweep.csv's grid line).
"$bin" sweep --engine agent scenarios/autocompact-200k.yaml scenarios/context-editing.yaml recordings/*.jsonl \
  --param ttl_main=5m,1h --param compact.autocompact.buffer_tokens=10000..16000:3000 \
  --param compact.context_editing.keep_tool_uses=1,3,5 \
  --out reports/sweep --quiet --no-progress

if [ -d "$realdata" ]; then
  mkdir -p reports/claude-trace reports/audit
  "$bin" analyze "$realdata/api_captures/claude-trace/test-traffic.jsonl" --from claude-trace \
    --trace reports/claude-trace/trace.jsonl --format json > reports/claude-trace/summary.json
  # The audit of every shipped real session: table, CSV and the HTML report.
  "$bin" audit "$realdata/transcripts" --out reports/audit --no-progress > reports/audit/audit.txt
  # Fidelity through the agent (the default engine; each session object says `"engine": "agent"`).
  "$bin" fidelity "$realdata"/transcripts/entireio-cli/*.full.jsonl "$realdata"/transcripts/spotter/*.jsonl \
    --format json --plot reports/fidelity > reports/fidelity.json
fi
"$bin" run scenarios --format table
