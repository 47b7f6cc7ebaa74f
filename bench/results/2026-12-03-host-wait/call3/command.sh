# Call 3: the SM clock, power and throttle reasons while llama-1b BF16 runs plain and with the GPU
# held 150 ms at each step's start (call1's held steps ran 7.7 ms faster, but call2's profiles put
# the GPU's idle time inside a step at 0.5 ms: what else differs?), then bench/speed.sh's seed b32
# rows on this build.
set -u
cd gpu-bundle
W=/tmp/w3; mkdir -p $W
export FP8SCOPE_GEMM_CACHE=$W/gemm-algorithms.json
date +%T
for lead in 0 150000 0 150000; do
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv,noheader -lms 100 > $W/clk-$lead.csv 2>/dev/null & SMI=$!
  FP8SCOPE_LEAD_US=$lead timeout 80 bin/fp8-capture train --quiet --device cuda --preset llama-1b --steps 16 --recipe bf16 --out $W/r-$lead > /dev/null 2>&1
  kill $SMI; wait $SMI 2>/dev/null
  python3 bench/runs.py speed $W/r-$lead --skip 4 | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print('lead_us $lead median', d['median_ms'])"
  python3 - $W/clk-$lead.csv <<'PY'
import sys, statistics
rows = [l.split(", ") for l in open(sys.argv[1]) if l.count(",") >= 5]
busy = [r for r in rows if float(r[3].split()[0]) > 200]   # samples drawing > 200 W: the run's steps
if not busy: print("  no busy samples"); sys.exit()
sm = [float(r[1].split()[0]) for r in busy]; pw = [float(r[3].split()[0]) for r in busy]
reasons = {}
for r in busy: reasons[r[5].strip()] = reasons.get(r[5].strip(), 0) + 1
print(f"  {len(busy)} samples over 200 W: SM clock median {statistics.median(sm):.0f} MHz (min {min(sm):.0f}, max {max(sm):.0f}), "
      f"power median {statistics.median(pw):.0f} W (max {max(pw):.0f}), temperature max {max(int(r[4]) for r in busy)} C, throttle reasons {reasons}")
PY
done
date +%T
(while sleep 15; do cp $W/speed/benchmarks_rows.md $W/speed/speed.jsonl $OUT/ 2>/dev/null; done) & CP=$!
timeout 420 bash bench/speed.sh bin $W/speed b32 > $W/b32.txt 2>&1; echo "speed rc $?"
cp $W/speed/benchmarks_rows.md $W/speed/speed.jsonl $W/b32.txt $OUT/ 2>/dev/null
kill $CP
date +%T
cd $W && tar czf $OUT/results.tgz clk-*.csv b32.txt speed/*.log speed/runs/*.log 2>/dev/null
