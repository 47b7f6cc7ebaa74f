# Call 5: correctness of the new binary: every table of old and new with every recording path on
# (bench/dump_shadow_check.sh: small and llama-small, dumps and BF16 shadow GEMMs), then
# bench/gpu_check.sh (the GPU tests, CPU/GPU parity over 100 steps, GPU reruns).
set -u
cd gpu-bundle
echo "== dump_shadow_check old bin"
timeout 150 bash bench/dump_shadow_check.sh old bin $OUT/dsc > $OUT/dump_shadow_check.txt 2>&1; echo "rc $?"; tail -4 $OUT/dump_shadow_check.txt | cut -c1-400
echo "== gpu_check"
timeout 400 bash bench/gpu_check.sh bin $OUT/gc > $OUT/gpu_check.txt 2>&1; echo "rc $?"
grep -E "test result|parity|determinism|status" $OUT/gpu_check.txt | cut -c1-300
