#!/usr/bin/env bash
# Nsight Compute on a few of the engine's kernels inside a real training run (a machine with an H200
# and ncu; clocks left alone): for each launch configuration of the kernels whose names match
# KERNELS, one launch after the first SKIP is profiled with the sections that say what bounds it
# (speed of light, occupancy, warp stall reasons, pipe utilisation, instruction mix, memory).
# Usage: bench/ncu_kernels.sh BIN_DIR OUT_DIR [PRESET] [RECIPE] [KERNELS_REGEX] [SKIP]
#   defaults: llama-1b delayed '^(flash_.*_d64|cast_fwd_l[01]_f1_t2)$' 40; STEPS (environment, 4)
#   training steps. SKIP counts launches of each configuration: 40 reaches the third step of a
#   kernel launched once a layer at llama-1b (16 layers), away from the first step: the paired
#   SwiGLU-backward cast profiled there took 557 µs and 366.6 M warp instructions, and 348.8 µs
#   and 219.1 M at the 41st launch (bench/results/2026-12-02-paired-cast-occupancy, then
#   2026-12-02-batched-stats): the first steps' values take the casts' slow path. A configuration
#   launched SKIP times or fewer in the run is not profiled: lower SKIP for it. EXTRA (environment)
#   adds fp8-capture arguments: EXTRA='--stats-every 0' profiles the amax-level casts.
set -uo pipefail
BIN=${1:?bin dir}; OUT=${2:?out dir}; PRESET=${3:-llama-1b}; RECIPE=${4:-delayed}
KERNELS=${5:-'^(flash_.*_d64|cast_fwd_l[01]_f1_t2)$'}; SKIP=${6:-40}; STEPS=${STEPS:-4}
REPORT="$OUT/ncu-$PRESET-$RECIPE$(echo "${EXTRA:-}" | tr -c 'a-zA-Z0-9\n' '_').txt"
command -v ncu > /dev/null || { echo "ncu_kernels.sh: ncu is not on the PATH" >&2; exit 2; }
mkdir -p "$OUT"
ncu --clock-control none --target-processes all -k "regex:$KERNELS" --filter-mode per-launch-config \
  --launch-skip "$SKIP" --launch-count 1 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section ComputeWorkloadAnalysis --section InstructionStats --section MemoryWorkloadAnalysis \
  "$BIN/fp8-capture" train --quiet --device cuda --preset "$PRESET" --recipe "$RECIPE" --steps "$STEPS" \
  ${EXTRA:-} --out "$OUT/run" > "$REPORT" 2>&1
rc=$?
echo "ncu exit $rc; report: $REPORT"
grep -E "^  [a-z_0-9]+.*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy|No Eligible|Stall" "$REPORT" | head -120
exit $rc
