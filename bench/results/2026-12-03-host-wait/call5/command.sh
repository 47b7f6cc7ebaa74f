# Call 5: bench/power.sh at seed b32: the SM clock, power and energy a step, torch_tiny.py
# compile_fused beside ours (BF16, FP8 delayed), and ours with the GPU held 60 ms at each step's start.
set -u
cd gpu-bundle
W=/tmp/w5; mkdir -p $W
export FP8SCOPE_GEMM_CACHE=$W/gemm-algorithms.json
date +%T
timeout 300 bash bench/power.sh bin $W/power 60 seed-b32; echo "power rc $?"
date +%T
cp $W/power/power.jsonl $OUT/ 2>/dev/null
cd $W/power && tar czf $OUT/results.tgz *.csv *.log 2>/dev/null
