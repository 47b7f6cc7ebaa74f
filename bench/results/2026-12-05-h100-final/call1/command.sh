# Call 1: bench/gpu_check.sh on f863bef's build (graphs on by default): the CUDA test binaries,
# small and llama-small parity with the CPU over 100 steps, bit-identical reruns.
set -u
cd gpu-bundle
date +%T; nvidia-smi --query-gpu=name --format=csv,noheader
timeout 570 bash bench/gpu_check.sh bin $OUT/g > $OUT/gpu_check.txt 2>&1; echo "gpu_check rc $?"
grep -E "test result|FAILED|panicked|parity|same|==" $OUT/gpu_check.txt | cut -c1-300 | head -40
date +%T
