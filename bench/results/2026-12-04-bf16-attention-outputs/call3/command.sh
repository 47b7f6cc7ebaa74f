# Call 3: the kept code (2e44444's engine; the commit after it changes a doc comment) through
# bench/gpu_check.sh, then the seed b32 targets side by side with torch.compile.
set -u
cd gpu-bundle
W=/tmp/w3; rm -rf $W; mkdir -p $W
date +%T
timeout 300 bash bench/gpu_check.sh bin $W/check > $W/gpu_check.txt 2>&1; echo "gpu_check.sh rc $?"
grep -E "test result|parity|max rel|identical|FAIL|differ|status" $W/gpu_check.txt | head -30
date +%T
export FP8SCOPE_GEMM_CACHE=$W/check/gemm-algorithms.json
bash bench/speed.sh bin $W/s b32 > $W/b32.txt 2>&1; echo "speed.sh rc $?"
tail -16 $W/b32.txt
date +%T
cp $W/gpu_check.txt $W/s/speed.jsonl $W/s/benchmarks_rows.md $W/b32.txt $OUT/ 2>/dev/null
