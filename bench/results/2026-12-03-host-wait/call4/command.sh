# Call 4: bench/power.sh: llama-1b's SM clock, power and energy a step, the peer (HF Llama under
# torch.compile) beside ours (BF16, FP8 delayed), and ours with the GPU held 150 ms at each step's
# start.
set -u
cd gpu-bundle
W=/tmp/w4; mkdir -p $W
export FP8SCOPE_GEMM_CACHE=$W/gemm-algorithms.json
date +%T
timeout 560 bash bench/power.sh bin $W/power 150; echo "power rc $?"
date +%T
cp $W/power/power.jsonl $OUT/ 2>/dev/null
cd $W/power && tar czf $OUT/results.tgz *.csv *.log 2>/dev/null
