#!/usr/bin/env bash
# Drives the real Claude Code CLI (a black box, installed from npm outside the repo) against
# `ctxsim serve`, as reference/real-client-oracle.md describes: fresh HOME with a fixed userID,
# IS_SANDBOX=1 for bypassPermissions as root, a working ripgrep on PATH, a fixed session id, the
# date pinned by a preload. Every request the CLI sends is measured; the log directory holds the
# request log (an `analyze` input), the trace and the summary.
#
#   scripts/real-client.sh NAME SCRIPT.json "PROMPT" [more CLI args...]
#
# Env: CC_DIR (the installed package; default /work/cc/node_modules/@anthropic-ai/claude-code),
# CTXSIM (the binary; default target/debug/ctxsim), OUT (default target/real-client/NAME),
# CC_DATE (default 2026-01-15), CC_EXTRA_ENV ("K=V K=V" passed to the CLI), ID_TAG.
# Exits 3 with a message when the CLI or node is missing, so callers can skip.
set -euo pipefail

name=${1:?usage: real-client.sh NAME SCRIPT.json PROMPT [cli args]}
script=$(realpath "${2:?script}")
prompt=${3:?prompt}
shift 3
repo=$(cd "$(dirname "$0")/.." && pwd)
cc_dir=${CC_DIR:-/work/cc/node_modules/@anthropic-ai/claude-code}
ctxsim=${CTXSIM:-${CARGO_TARGET_DIR:-$repo/target}/debug/ctxsim}
out=${OUT:-$repo/target/real-client/$name}
date_pin=${CC_DATE:-2026-01-15}

command -v node >/dev/null || { echo "real-client: node is not installed; skipping" >&2; exit 3; }
[ -f "$cc_dir/cli.js" ] || { echo "real-client: no Claude Code CLI at $cc_dir (npm install @anthropic-ai/claude-code@2.1.88); skipping" >&2; exit 3; }
[ -x "$ctxsim" ] || { echo "real-client: no ctxsim binary at $ctxsim (cargo build)" >&2; exit 2; }

rm -rf "$out"
mkdir -p "$out/home" "$out/bin" "$out/proj/.claude/rules"
# A fixed device id: it is part of metadata.user_id.
printf '{"userID":"%064d","hasCompletedOnboarding":true}\n' 1 > "$out/home/.claude.json"
# The bundled rg has no +x bit in this package: a copy on PATH instead (USE_BUILTIN_RIPGREP=0).
rg_src="$cc_dir/vendor/ripgrep/x64-linux/rg"
if [ -f "$rg_src" ]; then cp "$rg_src" "$out/bin/rg"; chmod +x "$out/bin/rg"; fi
# `Date` shifted to the pinned day (the client's own override variable is stripped from builds).
cp "$repo/scripts/fakedate.cjs" "$out/bin/fakedate.cjs"
# The project: our own small files, a git repository with fixed dates.
cat > "$out/proj/CLAUDE.md" <<'MD'
# demo
Small arithmetic helpers. Run `python3 -m unittest` after a change.
MD
printf -- '---\npaths: ["*.py"]\n---\nKeep functions pure.\n' > "$out/proj/.claude/rules/python.md"
printf 'def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n' > "$out/proj/calc.py"
printf 'from calc import add\n\nassert add(2, 2) == 4\n' > "$out/proj/test_calc.py"
(
  cd "$out/proj"
  git init -q -b main
  GIT_AUTHOR_DATE=2026-01-14T10:00:00Z GIT_COMMITTER_DATE=2026-01-14T10:00:00Z \
    git -c user.name=demo -c user.email=demo@example.invalid -c commit.gpgsign=false add -A
  GIT_AUTHOR_DATE=2026-01-14T10:00:00Z GIT_COMMITTER_DATE=2026-01-14T10:00:00Z \
    git -c user.name=demo -c user.email=demo@example.invalid -c commit.gpgsign=false commit -qm "calc helpers"
)

# `__P__` in the script stands for the project's absolute path.
sed "s|__P__|$out/proj|g" "$script" > "$out/script.json"
"$ctxsim" serve --script "$out/script.json" --log "$out/log" --id-tag "${ID_TAG:-$name}" --estimator chars4 > "$out/serve.out" 2> "$out/serve.err" &
serve_pid=$!
trap 'kill "$serve_pid" 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
  grep -q '^listening on ' "$out/serve.out" 2>/dev/null && break
  sleep 0.05
done
base_url=$(sed -n 's/^listening on //p' "$out/serve.out" | head -1)
[ -n "$base_url" ] || { echo "real-client: ctxsim serve did not start:" >&2; cat "$out/serve.err" >&2; exit 2; }

status=0
# shellcheck disable=SC2086
(cd "$out/proj" && env -i PATH="$out/bin:/usr/local/bin:/usr/bin:/bin" USE_BUILTIN_RIPGREP=0 TERM=dumb LANG=C.UTF-8 \
  HOME="$out/home" ANTHROPIC_BASE_URL="$base_url" ANTHROPIC_API_KEY=dummy \
  DISABLE_TELEMETRY=1 DISABLE_ERROR_REPORTING=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_AUTOUPDATER=1 \
  IS_SANDBOX=1 SHELL=/bin/bash CC_FAKE_DATE="$date_pin" NODE_OPTIONS="--require $out/bin/fakedate.cjs" ${CC_EXTRA_ENV:-} \
  timeout 120 node "$cc_dir/cli.js" -p "$prompt" --output-format json --permission-mode bypassPermissions \
    --session-id 00000000-0000-4000-8000-000000000001 "$@" > "$out/cli.json" 2> "$out/cli.err") || status=$?

kill -TERM "$serve_pid" 2>/dev/null || true
wait "$serve_pid" 2>/dev/null || true
trap - EXIT
echo "== CLI exit $status; its result: $out/cli.json"
head -c 600 "$out/cli.json"; echo
echo "== ctxsim serve (requests measured: $(wc -l < "$out/log/requests.jsonl"))"
tail -n +2 "$out/serve.out"
exit "$status"
