# Call 5: the targets' seed b32 rows (bench/speed.sh b32), then bench/gpu_check.sh: the tests, small and llama-small parity over 100 steps, GPU reruns.
set -u
cd gpu-bundle
bash bench/speed.sh bin $OUT/b32 b32 > $OUT/b32.txt 2>&1; echo "b32 rc $?"
cat $OUT/b32/benchmarks_rows.md | grep -vE "^\s*$" | cut -c1-260
timeout 250 bash bench/gpu_check.sh bin $OUT/gpu_check > $OUT/gpu_check.txt 2>&1; echo "gpu_check rc $?"; tail -25 $OUT/gpu_check.txt
