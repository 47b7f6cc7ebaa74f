#!/usr/bin/env bash
# Start-up of fp8-capture on a fresh GPU machine: the seconds from the process start to the end of
# the first training step (run.json's first_step_s), with empty kernel and GEMM-algorithm caches,
# for `tiny` and `llama-1b`:
#   precompiled  the kernels compiled at build time and embedded in the binary (the default);
#   nvrtc        FP8SCOPE_PRECOMPILED=0: NVRTC compiles every kernel at start-up (the fallback);
#   warm         a second run on the caches the first left (the kernel cache and timed GEMMs).
# Each row also has the process's whole wall time for its few steps.
# Usage: bench/start_up.sh BIN_DIR OUT_DIR   (BIN_DIR holds fp8-capture; bench/stage.sh builds it)
set -uo pipefail
BIN=${1:?bin dir}; OUT=${2:?out dir}
mkdir -p "$OUT/runs"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
status=0
one() {  # one NAME PRESET CACHE_TAG [env...]: a 3-step run on the caches named CACHE_TAG
  local name=$1 preset=$2 tag=$3; shift 3
  local t0=$(date +%s.%N)
  env "$@" FP8SCOPE_KERNEL_CACHE="$OUT/kernel-cache-$tag" FP8SCOPE_GEMM_CACHE="$OUT/gemm-$tag.json" FP8SCOPE_VERBOSE=1 \
    "$BIN/fp8-capture" train --quiet --device cuda --preset "$preset" --recipe delayed --steps 3 --out "$OUT/runs/$name" \
    > "$OUT/$name.log" 2>&1 || { status=1; tail -3 "$OUT/$name.log"; }
  local t1=$(date +%s.%N)
  python3 - "$OUT/runs/$name/run.json" "$name" "$preset" "$t0" "$t1" "$OUT/$name.log" <<'PY' | tee -a "$OUT/start_up.jsonl"
import json, sys
m = json.load(open(sys.argv[1]))
log = [l.strip() for l in open(sys.argv[6]) if "kernels for" in l]
print(json.dumps(dict(name=sys.argv[2], preset=sys.argv[3], first_step_s=m.get("first_step_s"),
                      wall_s=round(float(sys.argv[5]) - float(sys.argv[4]), 2), status=m["status"],
                      kernels=log[0] if log else None)))
PY
}
for preset in tiny llama-1b; do
  rm -rf "$OUT/kernel-cache-$preset" "$OUT/gemm-$preset.json"
  one "$preset-precompiled-fresh" "$preset" "$preset"
  one "$preset-precompiled-warm" "$preset" "$preset"
done
rm -rf "$OUT/kernel-cache-tiny-nvrtc" "$OUT/gemm-tiny-nvrtc.json"
one tiny-nvrtc-fresh tiny tiny-nvrtc FP8SCOPE_PRECOMPILED=0
one tiny-nvrtc-warm tiny tiny-nvrtc FP8SCOPE_PRECOMPILED=0
# The same losses whichever way the kernels came.
python3 "$(dirname "$0")/runs.py" same "$OUT/runs/tiny-precompiled-fresh" "$OUT/runs/tiny-nvrtc-fresh" | tee -a "$OUT/start_up.jsonl" || status=1
echo "== start_up status $status"
exit $status
