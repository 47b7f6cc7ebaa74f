set -u
O=$OUT
cd gpu-bundle
echo "== cuda_layers (every test) on bin"
timeout 200 bin/cuda_layers --nocapture --test-threads 1 > $O/cuda_layers.txt 2>&1; echo "rc $?"
grep -E "test result|FAILED|panicked|fused vs unfused|forward \+ backward" $O/cuda_layers.txt
med() { python3 bench/runs.py speed "$1" --skip 4 | grep -oE '"median_ms": [0-9.]+' | grep -oE '[0-9.]+$'; }
R=/tmp/runs; mkdir -p $R
run() { # name bindir preset steps args...
  local n=$1 b=$2 p=$3 s=$4; shift 4
  timeout 120 $b/fp8-capture train --quiet --device cuda --preset $p --steps $s --out $R/$n "$@" > $R/$n.log 2>&1 || tail -2 $R/$n.log
  echo -n " $n $(med $R/$n)"
}
export FP8SCOPE_GEMM_TUNE=0
echo "== old (926612e) against new with the old GEMM algorithms and split accumulation: the attention's stored score gradients"
run l-old old llama-1b 10 --recipe delayed
run l-new bin llama-1b 10 --recipe delayed --accumulation split
echo; echo -n "losses llama delayed old vs new: "; python3 bench/runs.py same $R/l-old $R/l-new | tail -1
run lb-old old llama-1b 10 --recipe bf16
run lb-new bin llama-1b 10 --recipe bf16
echo; echo -n "losses llama bf16 old vs new: "; python3 bench/runs.py same $R/lb-old $R/lb-new | tail -1
run b-old old seed 12 --recipe delayed --batch 32
run b-new bin seed 12 --recipe delayed --batch 32 --accumulation split
echo; echo -n "losses b32 delayed old vs new: "; python3 bench/runs.py same $R/b-old $R/b-new | tail -1
for v in old bin; do FP8SCOPE_PROFILE=1 timeout 60 $v/fp8-capture train --quiet --device cuda --preset llama-1b --recipe delayed --steps 6 --out $R/p-$v $([ $v = bin ] && echo --accumulation split) > $O/profile_llama_$v.txt 2>&1; done
grep -E "^  (attention|gemm |total)" $O/profile_llama_old.txt $O/profile_llama_bin.txt
unset FP8SCOPE_GEMM_TUNE
echo "== gpu_check on bin (defaults: fast fprop, timed GEMM algorithms)"
timeout 280 bash bench/gpu_check.sh bin $O/gpu_check > $O/gpu_check.txt 2>&1; echo "rc $?"
grep -E "test result|parity|determinism|gpu_check status|GEMM algorithm cache|FAILED" $O/gpu_check.txt | cut -c1-300
