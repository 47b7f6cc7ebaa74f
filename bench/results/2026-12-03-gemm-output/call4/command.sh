# Call 4 (call 3 failed: three new kernels were missing from the loader's list). The GEMM output
# change against prev (beca82c's engine): llama-1b delayed from each binary with every table
# compared; profiles of the new binary; step times of both presets, BF16 and FP8, with and without
# statistics; seed b32 from prev for the same; then bench/gpu_check.sh (GPU tests, parity, reruns).
set -u
cd gpu-bundle
export FP8SCOPE_GEMM_CACHE=$OUT/gemm-algorithms.json
R=/tmp/runs; mkdir -p $R
sp() { python3 bench/runs.py speed "$@" | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print(d['run'], d['median_ms'], d.get('final_loss'))"; }
for b in prev bin; do
  timeout 100 $b/fp8-capture train --quiet --device cuda --preset llama-1b --steps 12 --recipe delayed --out $R/l-$b > $OUT/llama_$b.txt 2>&1
  echo "== llama-1b delayed $b rc $?"; sp $R/l-$b --skip 4
done
python3 bench/runs.py tables $R/l-prev $R/l-bin 2>&1 | tail -2
for p in "seed --batch 32" "llama-1b"; do
  for spec in "bf16 --stats-every 0" "delayed"; do
    set -- $spec; r=$1; shift; tag="$r${1:+-nostats}"; pt=${p%% *}
    FP8SCOPE_PROFILE=1 timeout 100 bin/fp8-capture train --quiet --device cuda --preset $p --steps 7 --recipe $r "$@" --out $R/p-$pt-$tag > $OUT/profile_${pt}_$tag.txt 2>&1
    echo "== profile $pt $tag rc $?"; grep -E "gemm|total" $OUT/profile_${pt}_$tag.txt | head -14
  done
done
echo "== step times (median of steps 5 on)"
for spec in "bf16" "delayed" "bf16 --stats-every 0" "delayed --stats-every 0"; do
  set -- $spec; r=$1; shift; tag="$r${1:+-nostats}"
  for b in bin prev; do
    timeout 60 $b/fp8-capture train --quiet --device cuda --preset seed --batch 32 --steps 20 --recipe $r "$@" --out $R/s-$b-$tag > /dev/null 2>&1; sp $R/s-$b-$tag --skip 5
  done
done
for spec in "bf16" "bf16 --stats-every 0" "delayed --stats-every 0"; do
  set -- $spec; r=$1; shift; tag="$r${1:+-nostats}"
  timeout 90 bin/fp8-capture train --quiet --device cuda --preset llama-1b --steps 12 --recipe $r "$@" --out $R/l-bin-$tag > /dev/null 2>&1; sp $R/l-bin-$tag --skip 4
done
python3 bench/runs.py parity $R/s-prev-delayed $R/s-bin-delayed 2>&1 | tail -1
python3 bench/runs.py parity $R/s-prev-bf16 $R/s-bin-bf16 2>&1 | tail -1
echo "== gpu_check"; date +%T
timeout 250 bash bench/gpu_check.sh bin $OUT/gc > $OUT/gpu_check.txt 2>&1; echo "rc $?"
grep -E "test result|FAILED|panicked|non-finite counts|parity|determinism|status" $OUT/gpu_check.txt | cut -c1-300
date +%T
