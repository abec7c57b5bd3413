#!/usr/bin/env bash
# Builds the binary the main job, the reports and the audit benchmark run: Cargo.toml's `dist`
# profile, guided by a profile of a training run when LLVM's `llvm-profdata` is at hand (rustup's
# `llvm-tools` component; installed here when rustup can). Prints the binary's path on stdout;
# everything else goes to stderr.
#
# Profile-guided optimization (rustc's `-Cprofile-generate` / `-Cprofile-use`) changes only how
# fast the binary runs, never what it computes. The training run is `ctxsim audit --no-cache` over
# half of the shipped real sessions (the projects cipher-box, entireio-cli and spotter: see
# benches/README.md, "Session 46", for its effect on those and on the other half), or over
# recordings/ when the checkout has no ../shared/realdata. Without `llvm-profdata`, the plain
# `dist` build, said so on stderr.
#
# Two builds in target directories of their own (`target/pgo-gen`, `target/pgo`: their RUSTFLAGS
# differ from a plain build's, so they do not throw away its artifacts); the training run and the
# merge are redone only when the instrumented binary changed.
# Usage: scripts/build-dist.sh        (from anywhere; CARGO_TARGET_DIR moves `target`)
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
plain() {
  echo "build-dist: $1; the plain \`dist\` build" >&2
  cargo build --profile dist --locked --quiet >&2
  echo "$target/dist/ctxsim"
}

host=$(rustc -vV | sed -n 's/^host: //p')
tools="$(rustc --print sysroot)/lib/rustlib/$host/bin"
if [ ! -x "$tools/llvm-profdata" ] && command -v rustup > /dev/null; then
  echo "build-dist: adding rustup's llvm-tools component (llvm-profdata) to the active toolchain" >&2
  rustup component add llvm-tools > /dev/null 2>&1 || true
fi
[ -x "$tools/llvm-profdata" ] || { plain "no llvm-profdata in $tools (rustup component add llvm-tools)"; exit 0; }
shipped=../shared/realdata/transcripts
if [ -d "$shipped" ]; then
  training=("$shipped/cipher-box" "$shipped/entireio-cli" "$shipped/spotter")
else
  training=(recordings)
fi

pgo="$(pwd)/$target/pgo-data"
mkdir -p "$pgo"
# `--target` keeps RUSTFLAGS off the build scripts and procedural macros.
RUSTFLAGS="-Cprofile-generate=$pgo/raw" cargo build --profile dist --locked --quiet \
  --target "$host" --target-dir "$target/pgo-gen" >&2
gen="$target/pgo-gen/$host/dist/ctxsim"
stamp=$(cksum < "$gen")
if [ ! -s "$pgo/merged.profdata" ] || [ "$(cat "$pgo/stamp" 2> /dev/null)" != "$stamp" ]; then
  echo "build-dist: profile-guided; the training run: ctxsim audit ${training[*]}" >&2
  rm -rf "$pgo/raw" "$pgo/merged.profdata" "$pgo/stamp"
  cache=$(mktemp -d)
  trap 'rm -rf "$cache"' EXIT
  # (Exit 1 is a session's warning, which still trains; anything above is a failure.)
  CTXSIM_CACHE_DIR="$cache" TZ=UTC "$gen" audit "${training[@]}" --no-cache --no-progress > /dev/null || [ "$?" -le 1 ]
  "$tools/llvm-profdata" merge -o "$pgo/merged.profdata" "$pgo/raw"
  echo "$stamp" > "$pgo/stamp"
fi
RUSTFLAGS="-Cprofile-use=$pgo/merged.profdata" cargo build --profile dist --locked --quiet \
  --target "$host" --target-dir "$target/pgo" >&2
echo "$target/pgo/$host/dist/ctxsim"
