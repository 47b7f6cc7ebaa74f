# Call 4: the review's commit (5034f6d: flash_heads checks the head counts itself; a kernel
# comment, the CUBIN byte-identical) through bench/gpu_check.sh.
set -u
cd gpu-bundle
W=/tmp/w4; rm -rf $W; mkdir -p $W
date +%T
timeout 400 bash bench/gpu_check.sh bin $W/check > $W/gpu_check.txt 2>&1; echo "gpu_check.sh rc $?"
grep -E "test result|\"check\"|status" $W/gpu_check.txt | cut -c1-200 | head -20
date +%T
cp $W/gpu_check.txt $OUT/
