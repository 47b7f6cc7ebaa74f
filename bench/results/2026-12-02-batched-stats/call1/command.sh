set -u
O=$OUT
cd gpu-bundle
echo "== gpu_check on $(cat .git-head 2>/dev/null)"
timeout 300 bash bench/gpu_check.sh bin $O/gpu_check > $O/gpu_check.txt 2>&1; echo "gpu_check rc $?"
grep -E "test result|parity|same|status" $O/gpu_check.txt | head -20
rm -rf $O/gpu_check/runs
echo "== profiles (8 steps), stats and nostats"
mkdir -p $O/runs
for p in "llama-1b" "seed --batch 32"; do
  for stats in stats nostats; do
    extra=(); [ $stats = nostats ] && extra=(--stats-every 0)
    tag=$(echo $p | tr -d ' -')-$stats
    FP8SCOPE_PROFILE=1 timeout 100 bin/fp8-capture train --quiet --device cuda --preset $p --recipe delayed "${extra[@]}" --steps 8 --out $O/runs/$tag > $O/profile_$tag.txt 2>&1
    echo "-- $tag"; grep -E "^  (gemm|total|rmsnorm|add|adamw|attention)" $O/profile_$tag.txt | head -14
  done
done
rm -rf $O/runs
echo "== ncu: dual casts and the paired cast, L0 and L1"
timeout 200 bash bench/ncu_kernels.sh bin $O/ncu llama-1b delayed '^(cast_fwd_l[01]_f1_t2|cast_src5_l[01]_f2)$' > $O/ncu_summary.txt 2>&1; echo "ncu rc $?"
grep -E "^  [a-z_0-9]+.*\(|Duration|Registers Per|Issue Slots Busy|Executed Instructions  " $O/ncu/ncu-llama-1b-delayed.txt | head -40
rm -rf $O/ncu/run
