set -u
O=$OUT
cd gpu-bundle
R=/tmp/runs; mkdir -p $R
for x in "llama-1b bf16 10 llama_bf16" "seed delayed 12 b32_delayed" "seed bf16 12 b32_bf16"; do
  set -- $x
  extra=""; [ $1 = seed ] && extra="--batch 32"
  FP8SCOPE_PROFILE=1 timeout 60 bin/fp8-capture train --quiet --device cuda --preset $1 --recipe $2 --steps 6 $extra --out $R/$4 > $O/profile_$4.txt 2>&1
  echo "== $4"; head -16 $O/profile_$4.txt | tail -14
done
# the llama-1b bf16 profile above was cut by its 60 s limit (10 steps); it ran again, 6 steps:
cd gpu-bundle && FP8SCOPE_PROFILE=1 timeout 110 bin/fp8-capture train --quiet --device cuda --preset llama-1b --recipe bf16 --steps 6 --out /tmp/pb > $OUT/profile_llama_bf16.txt 2>&1
