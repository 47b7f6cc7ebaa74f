#!/usr/bin/env bash
# Correctness on the GPU machine, in one go (about 3 minutes):
#  1. the CUDA test binaries (FP8 casts bit-exact vs the CPU emulation; every layer, the Llama
#     family's included, vs the CPU reference within its tolerance table, and bit-identical on a
#     rerun; the per-channel statistics of operand casts — amax channel exact, top channels' share
#     of sum x^2 to f64 rounding — vs the CPU's; whole runs with the step in CUDA graphs against
#     the same runs launch by launch, every table bit for bit),
#  2. parity: `small` and `llama-small` presets, same seed, 100 steps, bf16 and delayed: GPU loss
#     within 1% of the CPU's at every step,
#  3. determinism: two identical GPU runs give bit-identical loss columns (the first times its GEMM
#     algorithms into a fresh cache, the second reads them back).
# Usage: bench/gpu_check.sh BIN_DIR OUT_DIR   (BIN_DIR holds fp8-capture and the test binaries
# cuda_layers, cuda_kernels, cuda_graph, cuda_ranks; build them with bench/stage.sh on the build machine).
set -uo pipefail
BIN=${1:?bin dir}; OUT=${2:?out dir}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT/runs"
status=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "== GPU tests"
for t in cuda_kernels cuda_layers cuda_graph cuda_ranks; do
  "$BIN/$t" --nocapture --test-threads 1 2>&1 | tee "$OUT/test_$t.log" | grep -v "^$" | tail -60 || status=1
  grep -q "test result: ok" "$OUT/test_$t.log" || status=1
done
# A fresh GEMM algorithm cache: the first GPU run of each pair times its shapes, the second takes
# the cached algorithms, and the pair must still be bit-identical.
export FP8SCOPE_GEMM_CACHE="$OUT/gemm-algorithms.json"
rm -f "$FP8SCOPE_GEMM_CACHE"
cap() { "$BIN/fp8-capture" train --quiet "$@"; }
for p in ${PRESETS:-small llama-small}; do
  echo "== parity: $p preset, 100 steps, CPU vs GPU"
  for r in bf16 delayed; do
    cap --device cpu --preset $p --recipe $r --steps 100 --out "$OUT/runs/$p-$r-cpu" &
    cap --device cuda --preset $p --recipe $r --steps 100 --out "$OUT/runs/$p-$r-gpu" || status=1
    cap --device cuda --preset $p --recipe $r --steps 100 --out "$OUT/runs/$p-$r-gpu2" || status=1
    wait || status=1
    python3 "$HERE/runs.py" parity "$OUT/runs/$p-$r-cpu" "$OUT/runs/$p-$r-gpu" | tee -a "$OUT/checks.jsonl" || status=1
    python3 "$HERE/runs.py" same "$OUT/runs/$p-$r-gpu" "$OUT/runs/$p-$r-gpu2" | tee -a "$OUT/checks.jsonl" || status=1
  done
done
echo "== GEMM algorithm cache: $(grep -c '\[' "$FP8SCOPE_GEMM_CACHE" 2>/dev/null || echo 0) shapes timed"
echo "== gpu_check status $status"
exit $status
