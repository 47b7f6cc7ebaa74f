# Call 6 (a fresh machine), one binary (this pass's: the host's gap between steps printed with
# FP8SCOPE_VERBOSE=1):
#  1. llama-1b, 12 steps each, unprofiled, FP8SCOPE_VERBOSE=1: the host's time from a step's last
#     synchronisation to the next step's first launch, for delayed with channels every step, every
#     10th, no statistics, and BF16 with statistics;
#  2. SwiGLU's backward cast with its channel partials over runs (FP8SCOPE_PAIR_RUNS=1, "new")
#     against the default ("old"): llama-1b with statistics every step, delayed and BF16, 10
#     steps, median ms of steps 5 on; as many rounds as the call's time allows (up to 4), the
#     order of old and new swapped each round; each pair's loss columns compared.
set -u
cd gpu-bundle
date +%T; nvidia-smi --query-gpu=name --format=csv,noheader
export FP8SCOPE_GEMM_CACHE=/tmp/gemm-algorithms.json FP8SCOPE_KERNEL_CACHE=/tmp/kc
bash bench/env_bin.sh bin runs FP8SCOPE_PAIR_RUNS=1
# Compiles the kernels once (kept in FP8SCOPE_KERNEL_CACHE) before anything is timed.
timeout 200 bin/fp8-capture train --quiet --device cuda --preset small --steps 2 --out /tmp/warm > /dev/null 2>&1; echo "warm-up rc $?"; date +%T
W=/tmp/ab; mkdir -p $W
for v in "delayed-ch1 --recipe delayed" "delayed-ch10 --recipe delayed --channel-stats-every 10" "delayed-nostats --recipe delayed --stats-every 0" "bf16 --recipe bf16"; do
  n=${v%% *}; f=${v#* }
  FP8SCOPE_VERBOSE=1 timeout 80 bin/fp8-capture train --quiet --device cuda --preset llama-1b --steps 12 $f --out $W/gap-$n > $W/gap-$n.log 2>&1
  echo "$n rc $?: $(python3 bench/runs.py speed $W/gap-$n --skip 4 | grep -oE '"median_ms": [0-9.]+'); $(grep -E 'host between steps' $W/gap-$n.log)" | tee -a $OUT/host_gap.txt
done
date +%T
for r in 1 2 3 4; do
  order="old new"; [ $((r % 2)) -eq 0 ] && order="new old"
  for recipe in delayed bf16; do
    line="round $r, $recipe:"
    for v in $order; do
      b=bin; [ $v = new ] && b=runs
      timeout 80 $b/fp8-capture train --quiet --device cuda --preset llama-1b --recipe $recipe --steps 10 --out $W/$v-$recipe-$r > $W/$v-$recipe-$r.log 2>&1
      rc=$?
      line="$line $v $( [ $rc -eq 0 ] && python3 bench/runs.py speed $W/$v-$recipe-$r --skip 4 | grep -oE '"median_ms": [0-9.]+' | grep -oE '[0-9.]+$' || echo "rc$rc")"
    done
    echo "$line; loss columns: $(python3 bench/runs.py same $W/old-$recipe-$r $W/new-$recipe-$r 2>&1 | grep -oE '"pass": [a-z]+')" | tee -a $OUT/pair_runs_ab.txt
  done
  date +%T
done
