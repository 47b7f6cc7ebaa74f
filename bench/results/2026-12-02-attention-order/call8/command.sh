# Call 8: the llama-1b FP8 speed-up again, in a second call: three interleaved rounds of our BF16 and
# delayed (statistics every step) runs, 12 steps each, median of steps 5 on, as speed.sh's rounds take them (kept code, dcdfad0).
set -u
cd gpu-bundle
R=/tmp/runs; mkdir -p $R
med() { python3 bench/runs.py speed "$1" --skip 4 | grep -oE '"median_ms": [0-9.]+' | grep -oE '[0-9.]+$'; }
for i in 1 2 3; do
  for r in bf16 delayed; do
    timeout 150 bin/fp8-capture train --quiet --device cuda --preset llama-1b --steps 12 --recipe $r --out $R/$r-$i > $R/$r-$i.log 2>&1 || tail -2 $R/$r-$i.log
  done
  b=$(med $R/bf16-$i); d=$(med $R/delayed-$i)
  echo "round $i: bf16 $b delayed $d ratio $(python3 -c "print(round($b/$d, 4))")"
done
