# Call 4: the dump cost at the cadence, one layer every 50 steps, measured directly (speed.sh
# measures every 10 steps, an upper bound): llama-1b delayed with statistics, 100 steps (dumps at
# steps 1, 50, 100), and seed b32 delayed, 200 steps (dumps at 1, 50, 100, 150, 200), each against
# the same run without dumps, two rounds interleaved. Mean ms a step over steps 5 on.
set -u
cd gpu-bundle
W=/tmp/w4; mkdir -p $W
export FP8SCOPE_GEMM_CACHE=$W/gemm-algorithms.json
sp() { python3 bench/runs.py speed "$@" | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print(d['run'].split('/')[-1], 'median', round(d['median_ms'],2), 'mean', round(d['mean_ms'],2))"; }
date +%T
for i in 1 2; do
  timeout 60 bin/fp8-capture train --quiet --device cuda --preset llama-1b --steps 100 --recipe delayed --dump-every 50 --dump-layers 'layers\.5\.fc1' --out $W/l-dump-$i > /dev/null 2>&1; sp $W/l-dump-$i --skip 4
  timeout 60 bin/fp8-capture train --quiet --device cuda --preset llama-1b --steps 100 --recipe delayed --out $W/l-nodump-$i > /dev/null 2>&1; sp $W/l-nodump-$i --skip 4
done
for i in 1 2; do
  timeout 60 bin/fp8-capture train --quiet --device cuda --preset seed --batch 32 --steps 200 --recipe delayed --dump-every 50 --dump-layers 'layers\.5\.fc1' --out $W/s-dump-$i > /dev/null 2>&1; sp $W/s-dump-$i --skip 4
  timeout 60 bin/fp8-capture train --quiet --device cuda --preset seed --batch 32 --steps 200 --recipe delayed --out $W/s-nodump-$i > /dev/null 2>&1; sp $W/s-nodump-$i --skip 4
done
date +%T
