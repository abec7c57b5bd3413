#!/usr/bin/env bash
# The main job, as a user runs it: `ctxsim audit` over your own Claude Code sessions
# ($CLAUDE_CONFIG_DIR/projects for each entry of a comma-separated list, else ~/.claude/projects
# and ~/.config/claude/projects) when there are any, written to reports/mine/ (not committed);
# over the shipped real sessions (../shared/realdata/transcripts) otherwise. Then the example
# reports (scripts/reports.sh, deterministic).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(scripts/build-dist.sh)

roots=()
if [ -n "${CLAUDE_CONFIG_DIR:-}" ]; then
  IFS=',' read -ra dirs <<< "$CLAUDE_CONFIG_DIR"
  for d in "${dirs[@]}"; do roots+=("$d/projects"); done
else
  roots=("$HOME/.claude/projects" "$HOME/.config/claude/projects")
fi
found=""
for r in "${roots[@]}"; do
  if [ -d "$r" ] && [ -n "$(find -L "$r" -name '*.jsonl' -print -quit 2>/dev/null)" ]; then found=1; fi
done

if [ -n "$found" ]; then
  echo "ctxsim audit of your sessions (${roots[*]}), report in reports/mine/index.html:"
  "$bin" audit --out reports/mine || status=$?
  ./scripts/reports.sh
else
  # reports.sh audits the shipped real sessions into reports/audit/.
  ./scripts/reports.sh
  echo "no Claude Code sessions in ${roots[*]}; the shipped real sessions (reports/audit/index.html):"
  cat reports/audit/audit.txt
fi
exit "${status:-0}"
