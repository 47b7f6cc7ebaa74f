set -u
O=$OUT
cd gpu-bundle
timeout 400 bash bench/gpu_check.sh bin $O/gc > $O/gpu_check.log 2>&1; echo "rc $?"
grep -E "test result|parity|determinism|status|FAILED" $O/gpu_check.log | cut -c1-300
rm -rf $O/gc/runs
