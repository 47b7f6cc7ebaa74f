# Call 1: the first GPU run of the twenty-eighth and twenty-ninth passes' engine (bin/: the
# weights' FP8 casts in one launch, the channel cadence, the bias kernels' batched loads): the full
# check, every recorded table against ba14eed's build (old/) bit for bit, and rowsum_dequant alone
# under Nsight Compute, old and new.
set -u
cd gpu-bundle
W=/tmp/w1; rm -rf $W; mkdir -p $W/r
date +%T
timeout 330 bash bench/gpu_check.sh bin $W/check > $W/gpu_check.txt 2>&1; echo "gpu_check.sh rc $?"
grep -E "test result|parity|max rel|identical|FAIL|differ|status|weights" $W/gpu_check.txt | head -30
date +%T
PARTS=tables timeout 180 bash bench/compare_builds.sh old bin $W/cmp 2>&1 | tee $W/tables.txt | cut -c1-400
date +%T
export FP8SCOPE_GEMM_CACHE=$W/gemm-algorithms.json
timeout 60 bin/fp8-capture train --quiet --device cuda --preset seed --batch 32 --steps 2 --recipe delayed --out $W/r/warm > /dev/null 2>&1
for v in old bin; do
  timeout 60 ncu --clock-control none -k regex:"rowsum_dequant" -s 6 -c 3 --section SpeedOfLight \
    $v/fp8-capture train --quiet --device cuda --preset seed --batch 32 --steps 2 --recipe delayed --out $W/r/ncu-$v > $W/ncu_rowsum_$v.txt 2>&1
  echo "== ncu rowsum_dequant $v rc $?: $(grep -E 'Duration|DRAM Throughput' $W/ncu_rowsum_$v.txt | tr -s ' ' | tr '\n' ';')"
done
date +%T
cp $W/gpu_check.txt $W/tables.txt $W/ncu_*.txt $OUT/ 2>/dev/null
