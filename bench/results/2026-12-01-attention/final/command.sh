set -u
O=$OUT
cd gpu-bundle
export SPEED_TIMEOUT=200
echo "== speed llama"; timeout 330 bash bench/speed.sh bin $O/speed-llama llama > $O/speed-llama.log 2>&1; tail -14 $O/speed-llama.log
echo "== speed b32"; timeout 200 bash bench/speed.sh bin $O/speed-b32 b32 > $O/speed-b32.log 2>&1; tail -10 $O/speed-b32.log
echo "== llama-1b delayed, old then new"
for v in old new; do bin=bin; [ $v = old ] && bin=old
  timeout 100 $bin/fp8-capture train --quiet --device cuda --preset llama-1b --recipe delayed --steps 12 --out $O/runs/l1b-$v > /dev/null 2>&1
  python3 bench/runs.py speed $O/runs/l1b-$v --skip 4; done
python3 bench/runs.py same $O/runs/l1b-old $O/runs/l1b-new
echo "== gpu_check"; timeout 240 bash bench/gpu_check.sh bin $O/check > $O/gpu_check.log 2>&1; echo "rc $?"
grep -E "test result|parity|same|pass|FAIL|rel" $O/gpu_check.log | tail -24
