# Call 2 (the same machine, warm): call 1's cuda_graph tests again with a longer limit (in call 1
# they ran first on a bare machine, whose NVRTC compiled every kernel, and ran past 100 s).
cd gpu-bundle && export FP8SCOPE_GEMM_CACHE=/tmp/w1/gemm-algorithms.json
timeout 190 bin/cuda_graph --nocapture --test-threads 1 > $OUT/test_cuda_graph.log 2>&1; echo "cuda_graph rc $?"
grep -E "test |test result|panicked|GraphCounts|GEMM shape|CUDA graphs" $OUT/test_cuda_graph.log | cut -c1-300 | head -20; date +%T
