#!/usr/bin/env bash
# Where a llama-1b step's time goes on the GPU, per recipe, with and without statistics:
# FP8SCOPE_PROFILE=1 runs of 8 steps (the first 3 left out), each printing per-primitive GPU and
# host milliseconds per step, then its median step time.
# Usage: bench/llama_profile.sh BIN_DIR OUT_DIR [PRESET]
set -uo pipefail
BIN=${1:?bin dir}; OUT=${2:?out dir}; PRESET=${3:-llama-1b}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT/runs"
for spec in "bf16" "delayed" "bf16 --stats-every 0" "delayed --stats-every 0"; do
  set -- $spec
  r=$1; shift
  tag="$r${1:+-nostats}"
  log="$OUT/profile-$PRESET-$tag.log"
  FP8SCOPE_PROFILE=1 timeout 240 "$BIN/fp8-capture" train --quiet --device cuda --preset "$PRESET" --recipe "$r" "$@" --steps 8 \
    --out "$OUT/runs/$tag" > "$log" 2>&1
  echo "== $PRESET $tag (rc $?)"
  sed -n '/== CUDA backend profile/,$p' "$log" | head -16; grep -iE 'error|panick' "$log" | head -3
  python3 "$HERE/runs.py" speed "$OUT/runs/$tag" --skip 3 2>/dev/null
done
