# Call 2: bench/speed.sh's llama-1b rows (HF LlamaForCausalLM under torch.compile side by side), the
# final engine of the twentieth pass (629ec75). Rows copied to $OUT as they come.
set -u
cd gpu-bundle
W=/tmp/w2; mkdir -p $W
export FP8SCOPE_GEMM_CACHE=$W/gemm-algorithms.json
date +%T
(while sleep 15; do cp $W/speed/benchmarks_rows.md $W/speed/speed.jsonl $OUT/ 2>/dev/null; done) & CP=$!
timeout 560 bash bench/speed.sh bin $W/speed llama > $W/llama.txt 2>&1; echo "speed rc $?"
cp $W/speed/benchmarks_rows.md $W/speed/speed.jsonl $W/llama.txt $OUT/ 2>/dev/null
kill $CP
date +%T
