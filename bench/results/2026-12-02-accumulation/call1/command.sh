set -u
O=$OUT
cd gpu-bundle
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
echo "== cuda_layers on bin"
timeout 150 bin/cuda_layers --nocapture --test-threads 1 > $O/cuda_layers.txt 2>&1; echo "rc $?"
grep -E "test result|FAILED|panicked" $O/cuda_layers.txt
med() { python3 bench/runs.py speed "$1" --skip 4 | grep -oE '"median_ms": [0-9.]+' | grep -oE '[0-9.]+$'; }
R=/tmp/runs; mkdir -p $R
run() { # name bindir preset steps args...
  local n=$1 b=$2 p=$3 s=$4; shift 4
  timeout 120 $b/fp8-capture train --quiet --device cuda --preset $p --steps $s --out $R/$n "$@" > $R/$n.log 2>&1 || tail -2 $R/$n.log
  echo -n " $n $(med $R/$n)"
}
echo "== llama-1b delayed with statistics, 10 steps, median ms"
run l-old old llama-1b 10 --recipe delayed
run l-split bin llama-1b 10 --recipe delayed --accumulation split
run l-ff1 bin llama-1b 10 --recipe delayed
run l-fast bin llama-1b 10 --recipe delayed --accumulation fast
echo
FP8SCOPE_GEMM_TUNE=1 FP8SCOPE_VERBOSE=1 run l-ff-tune1 bin llama-1b 10 --recipe delayed
run l-ff2 bin llama-1b 10 --recipe delayed
FP8SCOPE_GEMM_TUNE=1 run l-ff-tune2 bin llama-1b 10 --recipe delayed
echo
echo -n "losses old vs split: "; python3 bench/runs.py same $R/l-old $R/l-split
echo -n "losses old vs fast-fprop: "; python3 bench/runs.py same $R/l-old $R/l-ff1 | tail -2
echo -n "losses fast-fprop tuned 1 vs 2: "; python3 bench/runs.py same $R/l-ff-tune1 $R/l-ff-tune2 | tail -2
grep "cuBLASLt tuning" $R/l-ff-tune1.log > $O/tuning_llama_fp8.txt; cat $O/tuning_llama_fp8.txt
echo "== llama-1b bf16"
run lb-old old llama-1b 10 --recipe bf16
FP8SCOPE_GEMM_TUNE=1 FP8SCOPE_VERBOSE=1 run lb-tune bin llama-1b 10 --recipe bf16
echo
grep "cuBLASLt tuning" $R/lb-tune.log > $O/tuning_llama_bf16.txt; cat $O/tuning_llama_bf16.txt
echo "== seed b32, 12 steps"
run b-old old seed 12 --recipe delayed --batch 32
run b-split bin seed 12 --recipe delayed --batch 32 --accumulation split
run b-ff bin seed 12 --recipe delayed --batch 32
FP8SCOPE_GEMM_TUNE=1 FP8SCOPE_VERBOSE=1 run b-ff-tune bin seed 12 --recipe delayed --batch 32
run bb-old old seed 12 --recipe bf16 --batch 32
FP8SCOPE_GEMM_TUNE=1 FP8SCOPE_VERBOSE=1 run bb-tune bin seed 12 --recipe bf16 --batch 32
echo
echo -n "losses old vs split b32: "; python3 bench/runs.py same $R/b-old $R/b-split
grep "cuBLASLt tuning" $R/b-ff-tune.log $R/bb-tune.log > $O/tuning_b32.txt; cat $O/tuning_b32.txt
echo "== parity small / llama-small delayed, default (fast fprop), 100 steps, CPU vs GPU"
for p in small llama-small; do
  bin/fp8-capture train --quiet --device cpu --preset $p --recipe delayed --steps 100 --out $R/$p-cpu &
  bin/fp8-capture train --quiet --device cuda --preset $p --recipe delayed --steps 100 --out $R/$p-gpu
  wait
  python3 bench/runs.py parity $R/$p-cpu $R/$p-gpu | tail -1
done
