#!/bin/sh
# Regenerates tests/data/api-requests/: the real Claude Code client (a 2.1.2xx/3xx native
# binary) run headless against `ctxsim serve` over four probes of `ctxsim profile capture`,
# keeping the transcript the client wrote and the request log `serve` kept of the same run.
# Usage (from the repository root): sh scripts/api-request-fixtures.sh /path/to/claude
# The work directory is fixed because its paths reach the requests (and so the hashes of the
# recorded messages); it holds no home directory of this machine. `serve` counts the usage it
# replies with under the pinned calibration tests/data/api-requests/calibration.json (the tests
# measure with it too), so refitting data/calibration.json does not invalidate the fixtures.
set -eu
client=${1:?usage: sh scripts/api-request-fixtures.sh /path/to/claude}
work=/tmp/ctxsim-apireq
out=tests/data/api-requests
probes="multi-turn resume compact-970k subagent"
args=""
for p in read $probes; do args="$args --probe $p"; done
rm -rf "$work"
# shellcheck disable=SC2086
target/debug/ctxsim profile capture --client "$client" --work "$work" --out "$work/profile.toml" \
  --calibration "$out/calibration.json" $args
for p in $probes; do
  rm -rf "${out:?}/$p"
  mkdir -p "$out/$p"
  # One project directory per probe: the session file and, for the subagent, its subagents/.
  cp -R "$work/$p"/home/.claude/projects/*/. "$out/$p/"
  cp "$work/$p/log/requests.jsonl" "$out/$p/serve-requests.jsonl"
done
"$client" --version > "$out/VERSION"
