#!/usr/bin/env bash
# Every kernel of fp8-capture's training steps by name, with its GPU time as Nsight Compute measures
# it one launch at a time (a machine with an H200 and ncu; clocks left alone): which kernels
# cuBLASLt runs for the engine's GEMMs (their names say tile, cluster and layout, to set beside
# the PyTorch peers' in bench/peer_profile.py's lists), and what a small kernel costs without the
# event spans of FP8SCOPE_PROFILE=1 around it.
# Usage: bench/step_kernels.sh BIN_DIR OUT_DIR PRESET RECIPE [fp8-capture args...]
#   Runs STEPS (environment, default 3) steps: the first times its GEMM algorithms unless
#   FP8SCOPE_GEMM_CACHE already holds them, so it is left out; the table is per step, over the rest.
#   Writes OUT_DIR/kernels-PRESET-RECIPE.csv (ncu's raw rows) and prints the table
#   (bench/step_kernels.py).
set -uo pipefail
BIN=${1:?bin dir}; OUT=${2:?out dir}; PRESET=${3:?preset}; RECIPE=${4:?recipe}; shift 4
STEPS=${STEPS:-3}
HERE=$(cd "$(dirname "$0")" && pwd)
command -v ncu > /dev/null || { echo "step_kernels.sh: ncu is not on the PATH" >&2; exit 2; }
mkdir -p "$OUT"
CSV="$OUT/kernels-$PRESET-$RECIPE.csv"
# The step marker: fp8-capture uploads a step's tokens first (upload_tokens), so the kernels are
# split into steps by the launches of the first kernel of a step (the embedding's forward).
ncu --clock-control none --csv --metrics gpu__time_duration.sum \
  "$BIN/fp8-capture" train --quiet --device cuda --preset "$PRESET" --recipe "$RECIPE" --steps "$STEPS" \
  "$@" --out "$OUT/run-$PRESET-$RECIPE" > "$CSV" 2> "$OUT/ncu-$PRESET-$RECIPE.err"
rc=$?
echo "ncu exit $rc"
python3 "$HERE/step_kernels.py" "$CSV" --steps "$STEPS"
exit $rc
