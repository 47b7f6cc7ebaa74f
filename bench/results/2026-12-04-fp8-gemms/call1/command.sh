# Call 1: the FP8 GEMMs at seed b32 and llama-1b, alone in PyTorch (torch._scaled_mm, torch.mm)
# against fp8-capture's own GEMM kernels in a seed b32 delayed step (Nsight Compute), and clean
# profiles of seed b32 with statistics and without (no quantisation-error step in the window).
set -u
cd gpu-bundle
W=/tmp/w1; rm -rf $W; mkdir -p $W/r
export FP8SCOPE_GEMM_CACHE=$W/gemm-algorithms.json
date +%T
python3 bench/gemm_shapes.py --preset seed-b32 --json $W/gemm_seed.json 2>&1 | tee $W/gemm_seed.txt
python3 bench/gemm_shapes.py --preset llama-1b --json $W/gemm_llama.json 2>&1 | tee $W/gemm_llama.txt
date +%T
# Warm the algorithm cache so that no step under ncu times algorithms.
timeout 60 bin/fp8-capture train --quiet --device cuda --preset seed --batch 32 --steps 2 --recipe delayed --out $W/r/warm > /dev/null 2>&1
STEPS=2 timeout 240 bash bench/step_kernels.sh bin $W/k seed delayed --batch 32 --stats-every 0 2>&1 | head -45 | tee $W/kernels_seed_delayed.txt
date +%T
for r in delayed bf16; do
  for s in stats nostats; do
    extra=(--quant-error-every 0); [ $s = nostats ] && extra=(--stats-every 0)
    FP8SCOPE_PROFILE=1 timeout 60 bin/fp8-capture train --quiet --device cuda --preset seed --batch 32 --steps 10 --recipe $r "${extra[@]}" --out $W/r/prof-$r-$s > /dev/null 2> $W/profile_seed_${r}_${s}.txt
    echo "-- profile $r $s"; grep -E "^  (gemm|attention|layernorm|total)" $W/profile_seed_${r}_${s}.txt | head -14
  done
done
date +%T
cd $W && tar czf $OUT/results.tgz *.txt *.json k/*.csv 2>/dev/null
