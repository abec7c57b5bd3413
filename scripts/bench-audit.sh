#!/usr/bin/env bash
# Wall time of `ctxsim audit` (default estimator) against ccusage's `session --json --offline`
# on the same files, side by side in one run (benches/README.md, "audit").
#
# The shipped real transcripts are laid out as ~/.claude/projects (tests/data/ccusage/make.sh's
# tree of copies: ccusage does not follow symbolic links to files); both tools read that tree
# through CLAUDE_CONFIG_DIR. The runs alternate (ccusage, audit cold, audit warm, ccusage, ...) so
# a load change on the shared machine hits all; each figure is the median of RUNS runs. "Cold" is
# `audit --no-cache` (every session replayed, every text tokenized); "warm" is
# `audit --no-result-cache` (every session replayed, texts' counts from the token-count cache a
# first run wrote); "cached" is plain `audit`, every session's result read from the result cache
# the first run wrote (all in CTXSIM_CACHE_DIR, a temporary directory). CTXSIM_BIN_BEFORE=PATH
# adds the same three columns for another binary (e.g. the commit before a change), its runs
# alternating with the others, its caches in a directory of its own (the result cache holds one
# entry per session, keyed by the executable).
#
# Needs ccusage 20.0.24: `npm install ccusage@20.0.24 @ccusage/ccusage-linux-x64@20.0.24` in a
# directory outside the repository, given as CCUSAGE_DIR (default /work/tools).
# Usage: scripts/bench-audit.sh [RUNS]     (from the repository root; builds the binary by
# scripts/build-dist.sh: the `dist` profile, profile-guided where it can be)
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-7}"
tools="${CCUSAGE_DIR:-/work/tools}"
ccusage="$tools/node_modules/.bin/ccusage"
[ -x "$ccusage" ] || { echo "no ccusage at $ccusage: npm install ccusage@20.0.24 @ccusage/ccusage-linux-x64@20.0.24 in $tools" >&2; exit 2; }
bin="${CTXSIM_BIN:-$(scripts/build-dist.sh)}"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/home"
tests/data/ccusage/tree.sh "$work/config"

export HOME="$work/home" CLAUDE_CONFIG_DIR="$work/config" CTXSIM_CACHE_DIR="$work/cache" TZ=UTC
before="${CTXSIM_BIN_BEFORE:-}"
# Seconds of wall time of one command (output discarded; a failure stops the script).
wall() {
  local t0 t1
  t0=$(date +%s%N)
  "$@" > /dev/null 2> "$work/stderr" || { local rc=$?; [ "$rc" -le 2 ] || { cat "$work/stderr" >&2; exit "$rc"; }; }
  t1=$(date +%s%N)
  echo "scale=3; ($t1 - $t0) / 1000000000" | bc
}
median() { sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

# One warm-up each (page cache, node's compile cache); the audit's also writes both caches.
load0=$(cut -d' ' -f1-3 /proc/loadavg)
wall "$ccusage" session --json --offline > /dev/null
wall "$bin" audit --no-progress > /dev/null
[ -z "$before" ] || CTXSIM_CACHE_DIR="$work/cache-before" wall "$before" audit --no-progress > /dev/null
: > "$work/ccusage.times"
: > "$work/cold.times"
: > "$work/warm.times"
: > "$work/cached.times"
: > "$work/before-cold.times"
: > "$work/before-warm.times"
: > "$work/before-cached.times"
for _ in $(seq "$runs"); do
  wall "$ccusage" session --json --offline >> "$work/ccusage.times"
  wall "$bin" audit --no-progress --no-cache >> "$work/cold.times"
  wall "$bin" audit --no-progress --no-result-cache >> "$work/warm.times"
  wall "$bin" audit --no-progress >> "$work/cached.times"
  if [ -n "$before" ]; then
    CTXSIM_CACHE_DIR="$work/cache-before" wall "$before" audit --no-progress --no-cache >> "$work/before-cold.times"
    CTXSIM_CACHE_DIR="$work/cache-before" wall "$before" audit --no-progress --no-result-cache >> "$work/before-warm.times"
    CTXSIM_CACHE_DIR="$work/cache-before" wall "$before" audit --no-progress >> "$work/before-cached.times"
  fi
done
c=$(median < "$work/ccusage.times")
echo "cores: $(nproc), load average before: $load0, after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "ccusage session --json --offline: $(tr '\n' ' ' < "$work/ccusage.times")-> median ${c}s"
report() {
  local a
  a=$(median < "$work/$2.times")
  echo "$1: $(tr '\n' ' ' < "$work/$2.times")-> median ${a}s, ratio to ccusage $(echo "scale=2; $a / $c" | bc)"
}
report "ctxsim audit, cold (--no-cache)" cold
report "ctxsim audit, warm (token cache, --no-result-cache)" warm
report "ctxsim audit, results cached" cached
if [ -n "$before" ]; then
  report "CTXSIM_BIN_BEFORE audit, cold" before-cold
  report "CTXSIM_BIN_BEFORE audit, warm" before-warm
  report "CTXSIM_BIN_BEFORE audit, results cached" before-cached
fi
