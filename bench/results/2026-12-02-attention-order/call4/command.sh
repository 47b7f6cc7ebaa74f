# Call 4: the targets' llama-1b rows (bench/speed.sh, our bf16 run repeated in each round), the new binary.
set -u
cd gpu-bundle
bash bench/speed.sh bin $OUT/llama llama > $OUT/llama.txt 2>&1; echo "llama rc $?"
cat $OUT/llama/benchmarks_rows.md | grep -vE "^\s*$" | cut -c1-260
