# Call 2: wall ms a step (steps.parquet step_ms) beside the profile's GPU ms a step, llama-1b, so
# that the time the device waits between steps shows: delayed with channels every step, every
# 10th, without statistics; BF16 with and without; then unprofiled runs of the same.
set -u
cd gpu-bundle
W=/tmp/w5; rm -rf $W; mkdir -p $W
export FP8SCOPE_GEMM_CACHE=$W/gemm-algorithms.json
date +%T; nvidia-smi --query-gpu=name --format=csv,noheader
run() {  # NAME PROFILE RECIPE FLAGS...
  local name=$1 prof=$2 recipe=$3; shift 3
  FP8SCOPE_PROFILE=$prof timeout 150 bin/fp8-capture train --quiet --device cuda --preset llama-1b --steps 16 \
    --recipe $recipe --quant-error-every 0 "$@" --out $W/r-$name > $W/profile_$name.txt 2>&1
  local rc=$?
  echo "== $name (rc $rc): $(grep -E '^  total' $W/profile_$name.txt) | $(grep -E 'GPU idle' $W/profile_$name.txt | grep -oE '[0-9.]+ ms a step')"
  python3 bench/runs.py speed $W/r-$name --skip 5 --name $name
}
run warm 0 delayed --stats-every 0
for p in 1 0; do
  run delayed-ch1-p$p $p delayed
  run delayed-ch10-p$p $p delayed --channel-stats-every 10
  run delayed-nostats-p$p $p delayed --stats-every 0
  run bf16-p$p $p bf16
  run bf16-nostats-p$p $p bf16 --stats-every 0
done
date +%T
cp $W/profile_*.txt $OUT/ 2>/dev/null
mkdir -p $OUT/steps; for d in $W/r-*; do cp $d/steps.parquet $OUT/steps/$(basename $d).parquet 2>/dev/null; done
