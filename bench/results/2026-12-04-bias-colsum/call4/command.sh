# Call 4: bench/gpu_check.sh on this build (tests, small / llama-small parity over 100 steps against
# the CPU, GPU reruns bit for bit).
set -u
cd gpu-bundle
W=/tmp/w4; rm -rf $W; mkdir -p $W
export FP8SCOPE_GEMM_CACHE=/tmp/w/gemm-algorithms.json
date +%T
timeout 420 bash bench/gpu_check.sh bin $W/gc > $W/gpu_check.txt 2>&1; echo "gpu_check rc $?"
grep -E "test result|FAILED|panicked|parity|same|status" $W/gpu_check.txt | cut -c1-300
date +%T
cp $W/gpu_check.txt $OUT/
