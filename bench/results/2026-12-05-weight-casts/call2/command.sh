# Call 2: the weights' launch test again (its BF16 weights' GEMMs now BF16 on both sides), then the
# llama-1b targets side by side with Hugging Face's Llama under torch.compile (bench/speed.sh llama).
set -u
cd gpu-bundle
W=/tmp/w2; rm -rf $W; mkdir -p $W
date +%T
timeout 90 bin/cuda_layers --test-threads 1 weights_cast_in_one_launch 2>&1 | tail -6 | tee $W/weights_test.txt
date +%T
export FP8SCOPE_GEMM_CACHE=$W/gemm-algorithms.json
timeout 470 bash bench/speed.sh bin $W/s llama > $W/llama.txt 2>&1; echo "speed.sh rc $?"
tail -18 $W/llama.txt
date +%T
cp $W/weights_test.txt $W/s/speed.jsonl $W/s/benchmarks_rows.md $W/llama.txt $OUT/ 2>/dev/null
