# Call 2: the targets' seed b32 rows (bench/speed.sh bin OUT b32) with the new binary, then one
# profile of seed b32 delayed from each binary (old, new).
set -u
cd gpu-bundle
export FP8SCOPE_GEMM_CACHE=$OUT/gemm-algorithms.json
bash bench/speed.sh bin $OUT/b32 b32 > $OUT/b32.txt 2>&1; echo "b32 rc $?"
grep -vE "^\s*$" $OUT/b32/benchmarks_rows.md | cut -c1-220
R=/tmp/runs; mkdir -p $R
for b in old bin; do
  FP8SCOPE_PROFILE=1 timeout 100 $b/fp8-capture train --quiet --device cuda --preset seed --batch 32 --steps 8 --recipe delayed --out $R/pb-$b > $OUT/profile_b32_$b.txt 2>&1
  echo "== profile $b"; grep -E "adamw|sumsq_all|fill_zero|crossentropy|total" $OUT/profile_b32_$b.txt
done
