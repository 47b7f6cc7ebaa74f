# Call 5: where a llama-1b step's time goes in this engine (FP8SCOPE_PROFILE=1: GPU and host ms a
# step by primitive), for the misses' explanation: FP8 delayed with statistics (channels every step
# and every 10th), without; BF16 with and without; --quant-error-every 0 so that no
# quantisation-error step falls in the window.
set -u
cd gpu-bundle
W=/tmp/w5; rm -rf $W; mkdir -p $W
export FP8SCOPE_GEMM_CACHE=$W/gemm-algorithms.json
date +%T; nvidia-smi --query-gpu=name --format=csv,noheader
run() {  # NAME RECIPE FLAGS...
  local name=$1 recipe=$2; shift 2
  FP8SCOPE_PROFILE=1 timeout 45 bin/fp8-capture train --quiet --device cuda --preset llama-1b --steps 10 \
    --recipe $recipe --quant-error-every 0 "$@" --out $W/r-$name > $W/profile_$name.txt 2>&1
  echo "== $name (rc $?): $(grep -E '^  total' $W/profile_$name.txt)"
}
run delayed-ch1 delayed
run delayed-ch10 delayed --channel-stats-every 10
run delayed-nostats delayed --stats-every 0
run bf16 bf16
run bf16-nostats bf16 --stats-every 0
date +%T; nvidia-smi --query-gpu=name --format=csv,noheader
cp $W/profile_*.txt $OUT/ 2>/dev/null
