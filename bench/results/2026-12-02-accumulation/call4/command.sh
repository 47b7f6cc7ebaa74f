set -u
cd gpu-bundle
bash bench/speed.sh bin $OUT/llama llama > $OUT/llama.txt 2>&1; echo "llama rc $?"
bash bench/speed.sh bin $OUT/b32 b32 > $OUT/b32.txt 2>&1; echo "b32 rc $?"
cat $OUT/llama/benchmarks_rows.md $OUT/b32/benchmarks_rows.md 2>/dev/null | grep -vE "^\s*$" | cut -c1-260
