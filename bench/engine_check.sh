#!/usr/bin/env bash
# The GPU engine after a change, in one call on a machine with an H200 (about 8 minutes):
#  1. bench/gpu_check.sh: the CUDA test binaries (FP8 bytes bit-exact, every layer within tolerance
#     on both attention paths, fused vs unfused attention side by side, bit-identical reruns),
#     small and llama-small parity with the CPU over 100 steps, bit-identical GPU reruns;
#  2. the loss columns of the previous binary (OLD_BIN) and this one, same runs, compared step by
#     step (max relative difference; a numerics change moves them within run-to-run noise), and
#     whether they are bit-identical (what a change that keeps the numerics must show), then every
#     recorded table of both with every layer dumped and shadow GEMMs on (dump_shadow_check.sh);
#  3. a short llama-1b run per recipe (RECIPES, default "bf16 delayed") under FP8SCOPE_PROFILE=1
#     (where the step's time goes), then the old and the new binary's llama-1b delayed step side by
#     side, unprofiled, in the same call (the speed-up of the change, the peak memory of each, and
#     whether their losses are bit-identical); OLD_NEW_RECIPES (default "delayed") picks the recipes
#     of that comparison.
# Usage: bench/engine_check.sh BIN_DIR OLD_BIN_DIR OUT_DIR [all|check|profile]  (default all)
set -uo pipefail
BIN=${1:?bin dir}; OLD=${2:?old bin dir}; OUT=${3:?out dir}; MODE=${4:-all}
case "$MODE" in all|check|profile) ;; *) echo "unknown mode '$MODE' (all, check, profile)" >&2; exit 2;; esac
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT/runs"
status=0
if [ "$MODE" != profile ]; then
  bash "$HERE/gpu_check.sh" "$BIN" "$OUT/check" > "$OUT/gpu_check.log" 2>&1 || status=1
  grep -E "^==|rel L2|fused|outside|FAIL|test result|parity|same|ok" "$OUT/gpu_check.log" | grep -v "^\s*$" | tail -80
  echo "== old vs new binary, 100 steps, GPU"
  for p in small llama-small; do
    for r in bf16 delayed; do
      "$OLD/fp8-capture" train --quiet --device cuda --preset $p --recipe $r --steps 100 --out "$OUT/runs/$p-$r-old" || status=1
      "$BIN/fp8-capture" train --quiet --device cuda --preset $p --recipe $r --steps 100 --out "$OUT/runs/$p-$r-new" || status=1
      python3 "$HERE/runs.py" parity "$OUT/runs/$p-$r-old" "$OUT/runs/$p-$r-new" --tol 0.01 | tee -a "$OUT/old_vs_new.jsonl" || status=1
      # Whether the change kept the numerics bit for bit (informational: a numerics change may not).
      python3 "$HERE/runs.py" same "$OUT/runs/$p-$r-old" "$OUT/runs/$p-$r-new" | tee -a "$OUT/old_vs_new.jsonl"
    done
  done
  # Every recorded table (stats included), every layer dumped, shadow GEMMs on (informational, as
  # `same` above: a change that keeps the numerics must show them bit-identical).
  echo "== old vs new, every table (dump_shadow_check.sh)"
  bash "$HERE/dump_shadow_check.sh" "$OLD" "$BIN" "$OUT/tables" cuda 2>&1 | grep -E '^(small|llama-small):' || true
fi
[ "$MODE" = check ] && { echo "== engine_check status $status"; exit $status; }
echo "== llama-1b, 8 steps per recipe, FP8SCOPE_PROFILE=1"
for r in ${RECIPES:-bf16 delayed}; do
  log="$OUT/llama1b-$r.log"
  FP8SCOPE_PROFILE=1 timeout 240 "$BIN/fp8-capture" train --quiet --device cuda --preset llama-1b --recipe $r --steps 8 \
    --out "$OUT/runs/llama1b-$r" > "$log" 2>&1
  echo "-- llama-1b $r (rc $?)"
  sed -n '/== CUDA backend profile/,$p' "$log" | head -40; grep -iE 'error|panick' "$log" | head -3
  python3 "$HERE/runs.py" speed "$OUT/runs/llama1b-$r" --skip 3 2>/dev/null
done
for r in ${OLD_NEW_RECIPES:-delayed}; do
  echo "== llama-1b $r, 12 steps, old binary then new, unprofiled (peak memory: nvidia-smi every 200 ms)"
  for v in old new; do
    b=$BIN; [ $v = old ] && b=$OLD
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$OUT/mem-$r-$v.log" 2>/dev/null & mp=$!
    timeout 240 "$b/fp8-capture" train --quiet --device cuda --preset llama-1b --recipe $r --steps 12 \
      --out "$OUT/runs/llama1b-$r-$v" > "$OUT/llama1b-$r-$v.log" 2>&1 || status=1
    kill $mp 2>/dev/null; wait $mp 2>/dev/null
    peak=$(sort -n "$OUT/mem-$r-$v.log" | tail -1 | tr -dc 0-9)
    echo "-- $v"; python3 "$HERE/runs.py" speed "$OUT/runs/llama1b-$r-$v" --skip 4 --peak-mib "${peak:-0}" 2>/dev/null
  done
  python3 "$HERE/runs.py" same "$OUT/runs/llama1b-$r-old" "$OUT/runs/llama1b-$r-new"
done
echo "== engine_check status $status"
exit $status
