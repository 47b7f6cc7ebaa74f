# Call 4: one profile of llama-1b delayed from each binary (old: dcdfad0's engine; bin: this pass's).
set -u
cd gpu-bundle
export FP8SCOPE_GEMM_CACHE=$OUT/gemm-algorithms.json
R=/tmp/runs; mkdir -p $R
for b in old bin; do
  FP8SCOPE_PROFILE=1 timeout 120 $b/fp8-capture train --quiet --device cuda --preset llama-1b --steps 7 --recipe delayed --out $R/pl-$b > $OUT/profile_llama_$b.txt 2>&1
  echo "== profile $b"; grep -E "adamw|sumsq_all|fill_zero|crossentropy|total" $OUT/profile_llama_$b.txt
done
