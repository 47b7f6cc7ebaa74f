#!/usr/bin/env bash
# MXFP8 and NVFP4 against BF16 and delayed scaling on `tiny` (CPU): 200 steps, 3 seeds each.
# Prints per recipe the loss averaged over the last 20 steps (mean ± spread over seeds) and its gap to
# BF16; the BF16 seeds' spread is the noise band. Usage: bench/micro_formats_tiny.sh [OUT_DIR] [STEPS]
set -euo pipefail
BIN=${FP8SCOPE_BIN:-$(dirname "$0")/../target/release}/fp8-capture
OUT=${1:-runs/micro-formats}
STEPS=${2:-200}
mkdir -p "$OUT"
declare -A FLAGS=(
  [bf16]="--recipe bf16"
  [delayed]="--recipe delayed"
  [mxfp8-te]="--recipe mxfp8 --mx-rounding te"
  [mxfp8-ocp]="--recipe mxfp8 --mx-rounding ocp"
  [nvfp4]="--recipe nvfp4"
  [nvfp4-no-rht]="--recipe nvfp4 --nvfp4-disable-rht"
  [nvfp4-no-sr]="--recipe nvfp4 --nvfp4-disable-stochastic-rounding"
  [nvfp4-1d]="--recipe nvfp4 --nvfp4-disable-2d-quantization"
)
ORDER="bf16 delayed mxfp8-te mxfp8-ocp nvfp4 nvfp4-no-rht nvfp4-no-sr nvfp4-1d"
for name in $ORDER; do
  for seed in 0 1 2; do
    run="$OUT/$name-s$seed"
    [ -f "$run/run.json" ] && grep -q '"completed"' "$run/run.json" && continue
    rm -rf "$run"
    # shellcheck disable=SC2086
    "$BIN" train --preset tiny --device cpu --steps "$STEPS" --seed "$seed" ${FLAGS[$name]} --name "$name-s$seed" --out "$run" --quiet
  done
done
python3 - "$OUT" "$ORDER" <<'PY'
import glob, sys
import numpy as np, pyarrow.parquet as pq
out, order = sys.argv[1], sys.argv[2].split()
def tail_loss(run):
    t = pq.ParquetDataset(sorted(glob.glob(f"{run}/steps/**/*.parquet", recursive=True))).read(columns=["step", "loss"])
    step, loss = t.column("step").to_numpy(), t.column("loss").to_numpy()
    return float(loss[np.argsort(step)][-20:].mean())
res = {n: np.array([tail_loss(f"{out}/{n}-s{s}") for s in range(3)]) for n in order}
base = res["bf16"]
band = base.max() - base.min()
print(f"{'recipe':<14} {'loss (last 20 steps, 3 seeds)':>30} {'gap to bf16':>12} {'gap / noise band':>17}")
for n in order:
    v = res[n]; gap = v.mean() - base.mean()
    print(f"{n:<14} {v.mean():>14.4f} ± {(v.max()-v.min())/2:<13.4f} {gap:>+12.4f} {gap/band if band else float('nan'):>17.1f}")
print(f"noise band (bf16 max - min over seeds): {band:.4f}")
PY
