# Call 3: the targets' llama-1b rows with the new binary (bench/speed.sh, our bf16 run repeated in each round).
set -u
cd gpu-bundle
export FP8SCOPE_GEMM_CACHE=$OUT/gemm-algorithms.json
bash bench/speed.sh bin $OUT/llama llama > $OUT/llama.txt 2>&1; echo "llama rc $?"
grep -vE "^\s*$" $OUT/llama/benchmarks_rows.md | cut -c1-240
