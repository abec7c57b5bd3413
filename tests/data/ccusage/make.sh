#!/usr/bin/env bash
# Regenerates session.json: ccusage 20.0.24's `session --json --offline` over the shipped real
# transcripts, laid out as Claude Code's ~/.claude/projects (one directory per project, the
# Entire checkpoints renamed <id>.jsonl, spotter's subagent files under <session>/subagents/).
# ccusage does not follow symbolic links to files, so the tree holds copies.
# Needs npm. Usage: tests/data/ccusage/make.sh   (from the repository root)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm init -y >/dev/null && npm install --silent ccusage@20.0.24 @ccusage/ccusage-linux-x64@20.0.24 >/dev/null)
mkdir -p "$work/home"
"$here/tree.sh" "$work/config"
HOME="$work/home" CLAUDE_CONFIG_DIR="$work/config" TZ=UTC "$work/node_modules/.bin/ccusage" session --json --offline > "$here/session.json"
echo "wrote $here/session.json"
