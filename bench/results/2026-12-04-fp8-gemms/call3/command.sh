# Call 3: the engine of this pass's HEAD (3df0948's engine: bbaa34b's plus the scratch error path in
# bf16_operands.rs) through bench/gpu_check.sh.
set -u
cd gpu-bundle
W=/tmp/w3; rm -rf $W; mkdir -p $W
date +%T
timeout 420 bash bench/gpu_check.sh bin $W/check > $W/gpu_check.txt 2>&1; echo "gpu_check.sh rc $?"
grep -E "test result|parity|max rel|identical|FAIL|differ|status" $W/gpu_check.txt | head -30
date +%T
cp $W/gpu_check.txt $OUT/ 2>/dev/null
