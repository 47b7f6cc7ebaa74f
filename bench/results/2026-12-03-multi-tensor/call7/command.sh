# Call 7: the targets' seed b32 rows with the final binary (call6's: BF16 logits and dlogits).
set -u
cd gpu-bundle
export FP8SCOPE_GEMM_CACHE=$OUT/gemm-algorithms.json
timeout 250 bash bench/speed.sh bin $OUT/b32 b32 > $OUT/b32.txt 2>&1; echo "b32 rc $?"
grep -vE "^\s*$" $OUT/b32/benchmarks_rows.md | cut -c1-220
