#!/usr/bin/env bash
# Wall time of `ctxsim audit` (default estimator) against ccusage's `session --json --offline`
# on the same files, side by side in one run (benches/README.md, "audit").
#
# The shipped real transcripts are laid out as ~/.claude/projects (tests/data/ccusage/make.sh's
# tree of copies: ccusage does not follow symbolic links to files); both tools read that tree
# through CLAUDE_CONFIG_DIR. The runs alternate (ccusage, audit, ccusage, audit, ...) so a load
# change on the shared machine hits both; each figure is the median of RUNS runs.
#
# Needs ccusage 20.0.24: `npm install ccusage@20.0.24 @ccusage/ccusage-linux-x64@20.0.24` in a
# directory outside the repository, given as CCUSAGE_DIR (default /work/tools).
# Usage: scripts/bench-audit.sh [RUNS]     (from the repository root; builds --release)
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-7}"
tools="${CCUSAGE_DIR:-/work/tools}"
ccusage="$tools/node_modules/.bin/ccusage"
[ -x "$ccusage" ] || { echo "no ccusage at $ccusage: npm install ccusage@20.0.24 @ccusage/ccusage-linux-x64@20.0.24 in $tools" >&2; exit 2; }
[ -n "${CTXSIM_BIN:-}" ] || cargo build --release --locked --quiet
bin="${CTXSIM_BIN:-${CARGO_TARGET_DIR:-target}/release/ctxsim}"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/home"
tests/data/ccusage/tree.sh "$work/config"

export HOME="$work/home" CLAUDE_CONFIG_DIR="$work/config" TZ=UTC
# Seconds of wall time of one command (output discarded; a failure stops the script).
wall() {
  local t0 t1
  t0=$(date +%s%N)
  "$@" > /dev/null 2> "$work/stderr" || { local rc=$?; [ "$rc" -le 2 ] || { cat "$work/stderr" >&2; exit "$rc"; }; }
  t1=$(date +%s%N)
  echo "scale=3; ($t1 - $t0) / 1000000000" | bc
}
median() { sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

# One warm-up each (page cache, node's compile cache).
wall "$ccusage" session --json --offline > /dev/null
wall "$bin" audit --no-progress > /dev/null
: > "$work/ccusage.times"
: > "$work/audit.times"
for _ in $(seq "$runs"); do
  wall "$ccusage" session --json --offline >> "$work/ccusage.times"
  wall "$bin" audit --no-progress >> "$work/audit.times"
done
c=$(median < "$work/ccusage.times")
a=$(median < "$work/audit.times")
echo "cores: $(nproc), load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "ccusage session --json --offline: $(tr '\n' ' ' < "$work/ccusage.times")-> median ${c}s"
echo "ctxsim audit (default estimator): $(tr '\n' ' ' < "$work/audit.times")-> median ${a}s"
echo "ratio audit / ccusage: $(echo "scale=2; $a / $c" | bc)"
