#!/usr/bin/env bash
# The main job: run the shipped scenarios and recordings, measure every request, and write the
# example reports under reports/. Real sessions from ../shared/realdata are used when present.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked --quiet
bin=target/release/ctxsim
realdata=../shared/realdata

"$bin" run scenarios --out reports/scenarios --quiet
"$bin" replay recordings/*.jsonl --trace reports/real-session/trace.jsonl --format json > reports/real-session/summary.json
"$bin" report reports/real-session/trace.jsonl --out reports/real-session --quiet
if [ -d "$realdata" ]; then
  mkdir -p reports/claude-trace
  "$bin" analyze "$realdata/api_captures/claude-trace/test-traffic.jsonl" --from claude-trace \
    --trace reports/claude-trace/trace.jsonl --format json > reports/claude-trace/summary.json
  "$bin" fidelity "$realdata"/transcripts/entireio-cli/*.full.jsonl "$realdata"/transcripts/spotter/*.jsonl \
    --format json --plot reports/fidelity > reports/fidelity.json
fi
"$bin" run scenarios --format table
