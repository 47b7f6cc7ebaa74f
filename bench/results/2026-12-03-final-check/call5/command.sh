# Call 5: the chunks' reduction of the normalizations' backward in f64 across 16 warps a block
# (kernels/norms.cuh: norm_bwd_reduce): cuda_layers (every layer against the CPU reference within
# its tolerance, reruns bit-identical), seed b32 and llama-1b profiles (layernorm_bwd and
# rmsnorm_bwd spans hold both kernels), then parity of the small preset over 100 steps.
set -u
cd gpu-bundle
W=/tmp/w5; mkdir -p $W
export FP8SCOPE_GEMM_CACHE=$W/gemm-algorithms.json
date +%T
bin/cuda_layers --nocapture --test-threads 1 2>&1 | grep -E "^test |test result|panicked|differ" | tail -24
date +%T
FP8SCOPE_PROFILE=1 timeout 60 bin/fp8-capture train --quiet --device cuda --preset seed --batch 32 --steps 7 --recipe delayed --out $W/p-seed > $W/profile_seed_delayed.txt 2>&1
grep -E "layernorm_bwd|total" $W/profile_seed_delayed.txt
FP8SCOPE_PROFILE=1 timeout 60 bin/fp8-capture train --quiet --device cuda --preset llama-1b --steps 7 --recipe delayed --out $W/p-llama > $W/profile_llama_delayed.txt 2>&1
grep -E "rmsnorm_bwd|total" $W/profile_llama_delayed.txt
date +%T
PRESETS=small timeout 100 bash bench/gpu_check.sh bin $W/gc > $W/gpu_check.txt 2>&1; echo "gpu_check rc $?"
grep -E "parity|determinism" $W/gc/checks.jsonl | cut -c1-160
date +%T
