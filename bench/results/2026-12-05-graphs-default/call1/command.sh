# Call 1: this build (the step graphs on by default; a recorded step leaves its recording for
# work that must run at once) on the GPU: the cuda_graph tests (small and llama-small trained
# launch by launch and in graphs, every table compared; a read and a new GEMM shape mid-step),
# then bench/graph_check.sh (fifteen cases trained with FP8SCOPE_GRAPH=0 and =1, every table
# compared bit for bit), then the cuda_layers tests if time is left.
set -u
cd gpu-bundle
W=/tmp/w1; rm -rf $W; mkdir -p $W
export FP8SCOPE_GEMM_CACHE=$W/gemm-algorithms.json
date +%T; nvidia-smi --query-gpu=name --format=csv,noheader
timeout 100 bin/cuda_graph --nocapture --test-threads 1 > $OUT/test_cuda_graph.log 2>&1; echo "cuda_graph rc $?"
grep -E "test |test result|panicked|GraphCounts|GEMM shape|CUDA graphs" $OUT/test_cuda_graph.log | cut -c1-300 | head -20
date +%T
timeout 170 bash bench/graph_check.sh bin $W/g 12 > $OUT/graph_check.txt 2>&1; echo "graph_check rc $?"
cut -c1-330 $OUT/graph_check.txt
date +%T
timeout 90 bin/cuda_layers --test-threads 1 > $OUT/test_cuda_layers.log 2>&1; echo "cuda_layers rc $?"
grep -E "test result|FAILED|panicked" $OUT/test_cuda_layers.log | head -8
date +%T
