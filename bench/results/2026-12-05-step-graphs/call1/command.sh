# Planned call 1: correctness of this build on the GPU, the step graphs' first run included.
# bench/gpu_check.sh runs cuda_kernels, cuda_layers and cuda_graph (small and llama-small trained
# launch by launch and in CUDA graphs in one process, every table compared bit for bit), then the
# 100-step parity and rerun checks. About 4 minutes.
set -u
cd gpu-bundle
date +%T; nvidia-smi --query-gpu=name --format=csv,noheader
bash bench/gpu_check.sh bin $OUT/check > $OUT/gpu_check.txt 2>&1; echo "gpu_check rc $?"
grep -E "test result|FAILED|panicked|SKIPPED|== |\"ok\"" $OUT/gpu_check.txt | head -40
grep -E "CUDA graphs|small|llama-small" $OUT/check/test_cuda_graph.log | head -20
date +%T
