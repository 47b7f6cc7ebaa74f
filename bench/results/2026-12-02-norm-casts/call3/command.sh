set -u
O=$OUT
cd gpu-bundle
echo "== cuda_layers (every test) on bin"
timeout 150 bin/cuda_layers --nocapture --test-threads 1 > $O/cuda_layers.txt 2>&1; echo "rc $?"
grep -E "test result|FAILED|panicked" $O/cuda_layers.txt
med() { python3 bench/runs.py speed "$1" --skip 4 | grep -oE '"median_ms": [0-9.]+' | grep -oE '[0-9.]+$'; }
R=/tmp/runs; mkdir -p $R
run() { # name bin preset steps args...
  local n=$1 b=$2 p=$3 s=$4; shift 4
  timeout 100 $b/fp8-capture train --quiet --device cuda --preset $p --steps $s --out $R/$n "$@" > $R/$n.log 2>&1 || tail -2 $R/$n.log
  echo -n " $b $(med $R/$n)"
}
echo "== llama-1b delayed with statistics, 10 steps, median ms: v1 (2ec6fd5) / bin (FP8 transposes by words)"
for i in 1 2; do echo -n "round $i:"; for v in v1 bin; do run l-$v-$i $v llama-1b 10 --recipe delayed; done; echo; done
echo -n "losses v1 vs bin: "; python3 bench/runs.py same $R/l-v1-1 $R/l-bin-1
echo -n "nostats round 1:"; for v in v1 bin; do run ln-$v $v llama-1b 10 --recipe delayed --stats-every 0; done; echo
echo "== targets: speed.sh bin llama"
timeout 400 bash bench/speed.sh bin $O/speed-llama llama > $O/speed-llama.log 2>&1; echo "rc $?"
tail -30 $O/speed-llama.log
cp $O/speed-llama/*.md $O/ 2>/dev/null; cp $O/speed-llama/*.jsonl $O/ 2>/dev/null; rm -rf $O/speed-llama
