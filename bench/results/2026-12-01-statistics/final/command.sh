set -u
O=$OUT
cd gpu-bundle
echo "== cuda_layers"
timeout 100 bin/cuda_layers --nocapture --test-threads 1 > $O/test_cuda_layers.txt 2>&1; echo "rc $?"
grep -E "test result|FAILED|panicked" $O/test_cuda_layers.txt | head -5
timeout 60 bin/cuda_kernels > $O/test_cuda_kernels.txt 2>&1; echo "cuda_kernels rc $?"
echo "== every table, old vs new (dump_shadow_check)"
timeout 120 bash bench/dump_shadow_check.sh old bin $O/dsc cuda 2>&1 | tail -3
echo "== speed llama"
timeout 400 bash bench/speed.sh bin $O/speed-llama llama > $O/speed-llama.txt 2>&1; echo "rc $?"
tail -25 $O/speed-llama.txt
cp $O/speed-llama/benchmarks_rows.md $O/speed-llama-rows.md 2>/dev/null
set -u
O=$OUT
cd gpu-bundle
timeout 500 bash bench/speed.sh bin $O/speed-b32 b32 > $O/speed-b32.txt 2>&1; echo "rc $?"
tail -22 $O/speed-b32.txt
set -u
O=$OUT
cd gpu-bundle
timeout 500 bash bench/gpu_check.sh bin $O/gc > $O/gpu_check.txt 2>&1; echo "rc $?"
tail -30 $O/gpu_check.txt
