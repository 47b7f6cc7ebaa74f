# Call 6: the seed b32 targets side by side with torch.compile and PyTorch's FP8 step, on call5's
# build (flash_bwd_delta 4 rows a warp, the cross-entropy's loads at once).
set -u
cd gpu-bundle
W=/tmp/w6; rm -rf $W; mkdir -p $W
date +%T
export FP8SCOPE_GEMM_CACHE=$W/gemm-algorithms.json
bash bench/speed.sh bin $W/s b32 > $W/b32.txt 2>&1; echo "speed.sh rc $?"
tail -16 $W/b32.txt
date +%T
cp $W/s/speed.jsonl $W/s/benchmarks_rows.md $W/b32.txt $OUT/ 2>/dev/null
