# Call 2: the seed b32 targets on this build, side by side with torch_tiny.py compile_fused.
set -u
cd gpu-bundle
W=/tmp/w2; rm -rf $W; mkdir -p $W
export FP8SCOPE_GEMM_CACHE=/tmp/w/gemm-algorithms.json
date +%T
bash bench/speed.sh bin $W/s b32 > $W/b32.txt 2>&1; echo "speed.sh rc $?"
tail -30 $W/b32.txt
date +%T
cp $W/b32.txt $W/s/speed.jsonl $W/s/benchmarks_rows.md $OUT/ 2>/dev/null
