#!/usr/bin/env bash
# Where a step's time goes on the GPU: FP8SCOPE_PROFILE=1 runs of the `seed` preset (25 steps), one
# per (binary, recipe, batch), each printing its per-primitive GPU and host milliseconds per step.
# Passing two binaries compares a change against the previous build in the same call.
# Usage: bench/profile.sh OUT_DIR BIN [BIN2 ...]   (each BIN is an fp8-capture executable)
set -uo pipefail
OUT=${1:?out dir}; shift
mkdir -p "$OUT"
for batch in 4 32; do
  for recipe in bf16 delayed; do
    for bin in "$@"; do
      tag=$(basename "$(dirname "$bin")")
      log="$OUT/profile-$tag-$recipe-b$batch.log"
      FP8SCOPE_PROFILE=1 "$bin" train --quiet --device cuda --preset seed --steps 25 --batch "$batch" \
        --recipe "$recipe" --out "$OUT/run-$tag-$recipe-b$batch" > "$log" 2>&1
      echo "== $tag $recipe b$batch (rc $?)"
      sed -n '/== CUDA backend profile/,$p' "$log"; grep -iE 'error|panick' "$log" | head -3
      python3 "$(dirname "$0")/runs.py" speed "$OUT/run-$tag-$recipe-b$batch" --skip 5 2>/dev/null
    done
  done
done
