set -u
O=$OUT
cd gpu-bundle
echo "== cuda_layers (every test) on bin"
timeout 150 bin/cuda_layers --nocapture --test-threads 1 > $O/cuda_layers.txt 2>&1; echo "rc $?"
grep -E "test result|FAILED|panicked" $O/cuda_layers.txt; grep -c "bit-identical" $O/cuda_layers.txt
echo "== every table, base (15277dd) against bin (dump_shadow_check)"
timeout 170 bash bench/dump_shadow_check.sh base bin $O/tables > $O/tables.txt 2>&1; echo "rc $?"; grep -vE "^\s*$" $O/tables.txt | tail -4
rm -rf $O/tables
med() { python3 bench/runs.py speed "$1" --skip 4 | grep -oE '"median_ms": [0-9.]+' | grep -oE '[0-9.]+$'; }
R=/tmp/runs; mkdir -p $R
run() { # name bin preset steps args...
  local n=$1 b=$2 p=$3 s=$4; shift 4
  timeout 100 $b/fp8-capture train --quiet --device cuda --preset $p --steps $s --out $R/$n "$@" > $R/$n.log 2>&1 || tail -2 $R/$n.log
  echo -n " $b $(med $R/$n)"
}
echo "== llama-1b delayed with statistics, 10 steps, median ms: base / v1 (pipelined loop) / bin (plus RMSNorm)"
for i in 1 2; do echo -n "round $i:"; for v in base v1 bin; do run l-$v-$i $v llama-1b 10 --recipe delayed; done; echo; done
echo -n "losses base vs bin: "; python3 bench/runs.py same $R/l-base-1 $R/l-bin-1
echo "== llama-1b bf16, 10 steps"
echo -n "round 1:"; for v in base bin; do run lb-$v $v llama-1b 10 --recipe bf16; done; echo
echo -n "losses base vs bin: "; python3 bench/runs.py same $R/lb-base $R/lb-bin
echo "== llama-1b delayed without statistics"
echo -n "round 1:"; for v in base bin; do run ln-$v $v llama-1b 10 --recipe delayed --stats-every 0; done; echo
echo "== seed b32 delayed with statistics, 12 steps"
echo -n "round 1:"; for v in base v1 bin; do run b-$v $v seed 12 --recipe delayed --batch 32; done; echo
echo -n "losses base vs bin: "; python3 bench/runs.py same $R/b-base $R/b-bin
echo "== profile bin llama-1b delayed"
FP8SCOPE_PROFILE=1 timeout 60 bin/fp8-capture train --quiet --device cuda --preset llama-1b --recipe delayed --steps 6 --out $R/p > $O/profile_llama.txt 2>&1
grep -E "^  (gemm |rmsnorm|upload|total|attention|adamw)" $O/profile_llama.txt
