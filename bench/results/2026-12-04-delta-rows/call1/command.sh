# Call 1: the build with flash_bwd_delta's rows taken 4 a warp (bin/) through bench/gpu_check.sh
# (it is also the first GPU run of a8bdde5's kernel files), and every recorded table of it against
# a8bdde5's build (old/), bit for bit (compare_builds.sh's tables part).
set -u
cd gpu-bundle
W=/tmp/w1; rm -rf $W; mkdir -p $W
date +%T
timeout 330 bash bench/gpu_check.sh bin $W/check > $W/gpu_check.txt 2>&1; echo "gpu_check.sh rc $?"
grep -E "test result|parity|max rel|identical|FAIL|differ|status" $W/gpu_check.txt | head -30
date +%T
PARTS=tables timeout 230 bash bench/compare_builds.sh old bin $W/cmp 2>&1 | tee $W/tables.txt | cut -c1-400
date +%T
cp $W/gpu_check.txt $W/tables.txt $OUT/ 2>/dev/null
