# Call 4: the llama-1b targets side by side with Hugging Face's Llama under torch.compile, on this
# pass's engine (bench/speed.sh llama).
set -u
cd gpu-bundle
W=/tmp/w4; rm -rf $W; mkdir -p $W
date +%T
export FP8SCOPE_GEMM_CACHE=$W/gemm-algorithms.json
bash bench/speed.sh bin $W/s llama > $W/llama.txt 2>&1; echo "speed.sh rc $?"
tail -18 $W/llama.txt
date +%T
cp $W/s/speed.jsonl $W/s/benchmarks_rows.md $W/llama.txt $OUT/ 2>/dev/null
