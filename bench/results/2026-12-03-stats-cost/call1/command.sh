# Call 1 of the seventeenth pass: where the statistics cost goes now, per span (dcdfad0's code):
# llama-1b and seed b32 FP8 delayed, profiled with statistics every step and without.
set -u
O=$OUT
cd gpu-bundle
export FP8SCOPE_GEMM_CACHE=$O/gemm-algorithms.json
R=/tmp/runs; mkdir -p $R
for s in 1 0; do
  FP8SCOPE_PROFILE=1 timeout 150 bin/fp8-capture train --quiet --device cuda --preset llama-1b --steps 8 --recipe delayed --stats-every $s --out $R/pl$s > $O/profile_llama_stats$s.txt 2>&1
  FP8SCOPE_PROFILE=1 timeout 150 bin/fp8-capture train --quiet --device cuda --preset seed --batch 32 --steps 10 --recipe delayed --stats-every $s --out $R/pb$s > $O/profile_b32_stats$s.txt 2>&1
done
for f in $O/profile_*; do echo "== $f"; grep -E "cast|total" $f; done
