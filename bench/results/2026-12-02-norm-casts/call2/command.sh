set -u
O=$OUT
cd gpu-bundle
echo "== cuda_layers (every test) on bin"
timeout 150 bin/cuda_layers --nocapture --test-threads 1 > $O/cuda_layers.txt 2>&1; echo "rc $?"
grep -E "test result|FAILED|panicked" $O/cuda_layers.txt; grep -E "^(rmsnorm|layernorm|V [0-9])" $O/cuda_layers.txt
T=/tmp/t; mkdir -p $T
echo "== every table, base (431b6fc) against bin, no shadow: dumps every 5 steps (fused on the other steps), and none"
for p in small llama-small; do
  for v in base bin; do
    timeout 60 $v/fp8-capture train --quiet --device cuda --preset $p --recipe delayed --steps 20 --dump-every 5 --dump-layers '.' --out $T/$p-d-$v > $T/$p-d-$v.log 2>&1 || tail -2 $T/$p-d-$v.log
    timeout 60 $v/fp8-capture train --quiet --device cuda --preset $p --recipe bf16 --steps 20 --out $T/$p-b-$v > $T/$p-b-$v.log 2>&1 || tail -2 $T/$p-b-$v.log
  done
  echo -n "$p delayed+dumps: "; python3 bench/runs.py tables $T/$p-d-base $T/$p-d-bin | tail -3
  echo -n "$p bf16: "; python3 bench/runs.py tables $T/$p-b-base $T/$p-b-bin | tail -3
done

rm -rf $T
med() { python3 bench/runs.py speed "$1" --skip 4 | grep -oE '"median_ms": [0-9.]+' | grep -oE '[0-9.]+$'; }
R=/tmp/runs; mkdir -p $R
run() { # name bin preset steps args...
  local n=$1 b=$2 p=$3 s=$4; shift 4
  timeout 100 $b/fp8-capture train --quiet --device cuda --preset $p --steps $s --out $R/$n "$@" > $R/$n.log 2>&1 || tail -2 $R/$n.log
  echo -n " $b $(med $R/$n)"
}
echo "== llama-1b delayed with statistics, 10 steps, median ms: base / bin"
for i in 1 2; do echo -n "round $i:"; for v in base bin; do run l-$v-$i $v llama-1b 10 --recipe delayed; done; echo; done
echo -n "losses base vs bin: "; python3 bench/runs.py same $R/l-base-1 $R/l-bin-1
echo "== llama-1b delayed without statistics"
echo -n "round 1:"; for v in base bin; do run ln-$v $v llama-1b 10 --recipe delayed --stats-every 0; done; echo
echo "== llama-1b bf16"
echo -n "round 1:"; for v in base bin; do run lb-$v $v llama-1b 10 --recipe bf16; done; echo
echo -n "losses base vs bin: "; python3 bench/runs.py same $R/lb-base $R/lb-bin
echo "== seed b32 delayed with statistics, 12 steps (LayerNorm)"
echo -n "round 1:"; for v in base bin; do run b-$v $v seed 12 --recipe delayed --batch 32; done; echo
echo -n "losses base vs bin: "; python3 bench/runs.py same $R/b-base $R/b-bin
echo -n "bf16 round 1:"; for v in base bin; do run bb-$v $v seed 12 --recipe bf16 --batch 32; done; echo
echo -n "losses base vs bin: "; python3 bench/runs.py same $R/bb-base $R/bb-bin
echo "== profile base and bin llama-1b delayed"
for v in base bin; do FP8SCOPE_PROFILE=1 timeout 60 $v/fp8-capture train --quiet --device cuda --preset llama-1b --recipe delayed --steps 6 --out $R/p-$v > $O/profile_llama_$v.txt 2>&1; done
grep -E "^  (gemm|rmsnorm|add|crossentropy|total)" $O/profile_llama_base.txt $O/profile_llama_bin.txt
