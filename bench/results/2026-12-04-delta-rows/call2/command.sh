# Call 2: flash_bwd_delta old (a8bdde5, one row a warp) against new (4 rows a warp) alone under
# Nsight Compute, with crossentropy_split_fwd's limiters, on seed b32 and llama-1b delayed steps;
# then GPU ms by span (FP8SCOPE_PROFILE=1), old and new interleaved.
set -u
cd gpu-bundle
W=/tmp/w2; rm -rf $W; mkdir -p $W/r
export FP8SCOPE_GEMM_CACHE=$W/gemm-algorithms.json
date +%T
for p in "seed --batch 32" "llama-1b"; do
  tag=$(echo $p | cut -d' ' -f1)
  timeout 90 bin/fp8-capture train --quiet --device cuda --preset $p --steps 2 --recipe delayed --out $W/r/warm-$tag > /dev/null 2>&1
  for v in old bin; do
    timeout 120 ncu --clock-control none -k regex:"flash_bwd_delta|crossentropy_split_fwd" -s 3 -c 2 \
      --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis \
      $v/fp8-capture train --quiet --device cuda --preset $p --steps 2 --recipe delayed --out $W/r/ncu-$tag-$v > $W/ncu_${tag}_$v.txt 2>&1
    echo "== ncu $tag $v rc $?"
    grep -E "flash_bwd_delta|crossentropy_split|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Compute \(SM\) Throughput|Registers Per|Stall" $W/ncu_${tag}_$v.txt | head -24
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
cp $W/ncu_*.txt $OUT/ 2>/dev/null
