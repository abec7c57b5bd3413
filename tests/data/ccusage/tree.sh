#!/usr/bin/env bash
# Lays out the shipped real transcripts as Claude Code's ~/.claude/projects under DEST/projects:
# one directory per project, the Entire checkpoints renamed <id>.jsonl, spotter's subagent files
# under <session>/subagents/. Copies, not links: ccusage 20.0.24 does not follow symbolic links
# to files. Used by make.sh and scripts/bench-audit.sh.
# Usage: tests/data/ccusage/tree.sh DEST   (from anywhere)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
data="$here/../../../../shared/realdata/transcripts"
# (The checkout's ../shared, as the tests read it: a worktree elsewhere has none.)
[ -d "$data" ] || { echo "tree.sh: no shipped transcripts at $data: the checkout's ../shared/realdata is missing" >&2; exit 2; }
dest="$1/projects"
mkdir -p "$dest"
for project in NumWordify cipher-box entirecontext entireio-cli oh-my-posh; do
  mkdir -p "$dest/$project"
  for f in "$data/$project"/*.full.jsonl; do
    cp "$f" "$dest/$project/$(basename "$f" .full.jsonl).jsonl"
  done
done
mkdir -p "$dest/spotter"
cp -r "$data/spotter/258c7280-ae70-4798-800f-63464d01a85d.jsonl" "$data/spotter/258c7280-ae70-4798-800f-63464d01a85d" "$dest/spotter/"
