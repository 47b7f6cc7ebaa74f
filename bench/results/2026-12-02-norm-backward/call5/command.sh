# Call 5: bench/gpu_check.sh on the kept code (1588b28): the tests, small and llama-small parity over 100 steps, GPU reruns.
set -u
cd gpu-bundle
timeout 250 bash bench/gpu_check.sh bin $OUT/gpu_check > $OUT/gpu_check.txt 2>&1; echo "rc $?"; tail -25 $OUT/gpu_check.txt
