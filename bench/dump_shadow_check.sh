#!/usr/bin/env bash
# Whether two fp8-capture binaries record the same runs bit for bit when every recording path is on:
# tensor dumps of every layer (the FP8 bytes and the high-precision values, GEMM outputs included)
# and the BF16 shadow GEMMs (which make the GPU backend recompute the activations it otherwise
# shares between layers), on `small` and `llama-small`, delayed scaling, 20 steps, one dump every 5.
# Every table (steps, stats, shadow, tensors, events) is compared by `runs.py tables`, wall-clock
# columns aside. For a change that keeps the numerics (about a minute on an H200).
# Usage: bench/dump_shadow_check.sh OLD_BIN_DIR NEW_BIN_DIR OUT_DIR [DEVICE (cuda)]
set -uo pipefail
OLD=${1:?old bin dir}; NEW=${2:?new bin dir}; OUT=${3:?out dir}; DEV=${4:-cuda}
HERE=$(cd "$(dirname "$0")" && pwd)
status=0
for p in small llama-small; do
  for v in old new; do
    b=$NEW; [ $v = old ] && b=$OLD
    "$b/fp8-capture" train --quiet --device "$DEV" --preset $p --recipe delayed --steps 20 --dump-every 5 \
      --dump-layers '.' --shadow --out "$OUT/$p-$v" || status=1
  done
  echo -n "$p: "; python3 "$HERE/runs.py" tables "$OUT/$p-old" "$OUT/$p-new" || status=1
done
echo "== dump_shadow_check status $status"
exit $status
