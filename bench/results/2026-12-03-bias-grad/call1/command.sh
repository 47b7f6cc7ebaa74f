# Call 1: the vectorised bias gradients (and f9b16b7's refactor) against prev (1d92fe4's engine):
# every table of llama-1b delayed and seed b32 BF16 / delayed compared; profiles of seed b32;
# llama-1b profiles with cuBLASLt's first 8 proposals timed (the default) against 32
# (FP8SCOPE_GEMM_TUNE=32); then bench/gpu_check.sh.
set -u
cd gpu-bundle
export FP8SCOPE_GEMM_CACHE=$OUT/gemm-algorithms.json
R=/tmp/runs; mkdir -p $R
sp() { python3 bench/runs.py speed "$@" | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print(d['run'], d['median_ms'], d.get('final_loss'))"; }
date +%T
for b in prev bin; do
  timeout 100 $b/fp8-capture train --quiet --device cuda --preset llama-1b --steps 12 --recipe delayed --out $R/l-$b > $OUT/llama_$b.txt 2>&1
  echo "== llama-1b delayed $b rc $?"; sp $R/l-$b --skip 4
done
python3 bench/runs.py tables $R/l-prev $R/l-bin 2>&1 | tail -2
for r in bf16 delayed; do
  for b in prev bin; do
    timeout 60 $b/fp8-capture train --quiet --device cuda --preset seed --batch 32 --steps 20 --recipe $r --out $R/s-$b-$r > /dev/null 2>&1; sp $R/s-$b-$r --skip 5
  done
  python3 bench/runs.py tables $R/s-prev-$r $R/s-bin-$r 2>&1 | tail -2
done
for spec in "bf16" "delayed"; do
  FP8SCOPE_PROFILE=1 timeout 60 bin/fp8-capture train --quiet --device cuda --preset seed --batch 32 --steps 7 --recipe $spec --out $R/p-seed-$spec > $OUT/profile_seed_$spec.txt 2>&1
  echo "== profile seed $spec rc $?"; grep -E "gemm|total" $OUT/profile_seed_$spec.txt | head -14
done
date +%T
for tune in 8 32; do
  for spec in "bf16 --stats-every 0" "delayed"; do
    set -- $spec; r=$1; shift; tag="$r${1:+-nostats}-top$tune"
    FP8SCOPE_GEMM_TUNE=$tune FP8SCOPE_PROFILE=1 timeout 100 bin/fp8-capture train --quiet --device cuda --preset llama-1b --steps 7 --recipe $r "$@" --out $R/p-l-$tag > $OUT/profile_llama_$tag.txt 2>&1
    echo "== profile llama $tag rc $?"; grep -E "gemm.matmul|matmul_bf16|total" $OUT/profile_llama_$tag.txt | head -5
  done
done
echo "== gpu_check"; date +%T
timeout 250 bash bench/gpu_check.sh bin $OUT/gc > $OUT/gpu_check.txt 2>&1; echo "rc $?"
grep -E "test result|FAILED|panicked|bias gradients|parity|determinism|status" $OUT/gpu_check.txt | cut -c1-300
date +%T
