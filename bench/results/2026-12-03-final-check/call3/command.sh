# Call 3: every kernel of a step by name (bench/step_kernels.sh, Nsight Compute one launch at a
# time): which cuBLASLt kernels the engine's BF16 GEMMs run, beside the peers' (torch.profiler
# lists in bench/results/2026-12-03-peer-profile), llama-1b and seed b32, BF16 without statistics.
set -u
cd gpu-bundle
W=/tmp/w3; mkdir -p $W
export FP8SCOPE_GEMM_CACHE=$W/gemm-algorithms.json
date +%T
# Time the GEMM algorithms first, outside ncu, so that the profiled steps run the chosen ones.
timeout 60 bin/fp8-capture train --quiet --device cuda --preset llama-1b --steps 2 --recipe bf16 --out $W/warm-l > /dev/null 2>&1
timeout 60 bin/fp8-capture train --quiet --device cuda --preset seed --batch 32 --steps 2 --recipe bf16 --out $W/warm-s > /dev/null 2>&1
date +%T
STEPS=2 timeout 200 bash bench/step_kernels.sh bin $W llama-1b bf16 --stats-every 0 > $W/llama-1b-bf16.txt 2>&1; echo "rc $?"
head -45 $W/llama-1b-bf16.txt
date +%T
STEPS=2 timeout 150 bash bench/step_kernels.sh bin $W seed bf16 --batch 32 --stats-every 0 > $W/seed-b32-bf16.txt 2>&1; echo "rc $?"
head -40 $W/seed-b32-bf16.txt
date +%T
cd $W && tar czf $OUT/results.tgz *.txt *.err gemm-algorithms.json
