# Call 3: flash_bwd_delta with 32-bit index arithmetic, each of 4 lanes writing one row (bin/),
# against a8bdde5 (old/): the attention's tests, every table bit for bit, the kernel alone under
# Nsight Compute, and GPU ms by span, old and new interleaved.
set -u
cd gpu-bundle
W=/tmp/w3; rm -rf $W; mkdir -p $W/r
export FP8SCOPE_GEMM_CACHE=$W/gemm-algorithms.json
date +%T
timeout 120 bin/cuda_layers --nocapture --test-threads 1 > $W/cuda_layers.txt 2>&1; echo "cuda_layers rc $?"
grep -E "test result|FAILED|panicked" $W/cuda_layers.txt | head
PARTS=tables timeout 200 bash bench/compare_builds.sh old bin $W/cmp 2>&1 | tee $W/tables.txt | cut -c1-300
date +%T
for p in "seed --batch 32" "llama-1b"; do
  tag=$(echo $p | cut -d' ' -f1)
  timeout 90 bin/fp8-capture train --quiet --device cuda --preset $p --steps 2 --recipe delayed --out $W/r/warm-$tag > /dev/null 2>&1
  for v in old bin; do
    timeout 120 ncu --clock-control none -k regex:"flash_bwd_delta" -s 3 -c 1 --section SpeedOfLight --section Occupancy \
      $v/fp8-capture train --quiet --device cuda --preset $p --steps 2 --recipe delayed --out $W/r/ncu-$tag-$v > $W/ncu_${tag}_$v.txt 2>&1
    echo "== ncu $tag $v rc $?: $(grep -E 'Duration|DRAM Throughput|Registers Per|Achieved Occ' $W/ncu_${tag}_$v.txt | tr -s ' ' | tr '\n' ';')"
  done
done
date +%T
for p in "llama-1b" "seed --batch 32"; do
  tag=$(echo $p | cut -d' ' -f1)
  for v in old bin old bin; do
    FP8SCOPE_PROFILE=1 timeout 100 $v/fp8-capture train --quiet --device cuda --preset $p --steps 8 --recipe delayed --out $W/r/prof-$tag-$v-$RANDOM > $W/prof.txt 2>&1
    echo "-- $tag $v: $(grep -E '^  (attention_bwd|total)' $W/prof.txt | tr -s ' ' | tr '\n' ' ')"
  done
done
date +%T
cp $W/ncu_*.txt $W/cuda_layers.txt $W/tables.txt $OUT/ 2>/dev/null
