# Call 5: c47fe77's flash_bwd_delta plus crossentropy_split_fwd with its 16 register logits loaded
# all at once (bin/), against a8bdde5 (old/): every test, every table bit for bit, the loss kernel
# alone under Nsight Compute, and whole steps (median ms) with GPU ms by span, old and new
# interleaved, seed b32 and llama-1b delayed.
set -u
cd gpu-bundle
W=/tmp/w5; rm -rf $W; mkdir -p $W/r
export FP8SCOPE_GEMM_CACHE=$W/gemm-algorithms.json
date +%T
timeout 120 bin/cuda_layers --nocapture --test-threads 1 > $W/cuda_layers.txt 2>&1; echo "cuda_layers rc $?"
grep -E "test result|FAILED|panicked|V [0-9]+:" $W/cuda_layers.txt | head -12
PARTS=tables timeout 200 bash bench/compare_builds.sh old bin $W/cmp 2>&1 | tee $W/tables.txt | cut -c1-300
date +%T
for p in "seed --batch 32" "llama-1b"; do
  tag=$(echo $p | cut -d' ' -f1)
  timeout 90 bin/fp8-capture train --quiet --device cuda --preset $p --steps 2 --recipe delayed --out $W/r/warm-$tag > /dev/null 2>&1
  for v in old bin; do
    timeout 100 ncu --clock-control none -k regex:"crossentropy_split_fwd" -s 1 -c 1 --section SpeedOfLight --section Occupancy \
      $v/fp8-capture train --quiet --device cuda --preset $p --steps 2 --recipe delayed --out $W/r/ncu-$tag-$v > $W/ncu_${tag}_$v.txt 2>&1
    echo "== ncu $tag $v rc $?: $(grep -E 'Duration|DRAM Throughput|Compute \(SM\) Th|Achieved Occ' $W/ncu_${tag}_$v.txt | tr -s ' ' | tr '\n' ';')"
  done
done
date +%T
for p in "seed --batch 32" "llama-1b"; do
  tag=$(echo $p | cut -d' ' -f1)
  for v in old bin old bin; do
    run=$W/r/prof-$tag-$v-$RANDOM
    FP8SCOPE_PROFILE=1 timeout 100 $v/fp8-capture train --quiet --device cuda --preset $p --steps 12 --recipe delayed --out $run > $W/prof.txt 2>&1
    echo "-- $tag $v: step $(python3 bench/runs.py speed $run --skip 4 | grep -oE '"median_ms": [0-9.]+') $(grep -E '^  (crossentropy|attention_bwd|total)' $W/prof.txt | tr -s ' ' | tr '\n' ' ')"
  done
done
date +%T
cp $W/ncu_*.txt $W/cuda_layers.txt $W/tables.txt $OUT/ 2>/dev/null
