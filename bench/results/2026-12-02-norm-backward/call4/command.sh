# Call 4: the targets' seed batch-32 rows (bench/speed.sh, with the bf16 run repeated in each round).
set -u
cd gpu-bundle
bash bench/speed.sh bin $OUT/b32 b32 > $OUT/b32.txt 2>&1; echo "b32 rc $?"
cat $OUT/b32/benchmarks_rows.md | grep -vE "^\s*$" | cut -c1-260
