set -u
O=$OUT
cd gpu-bundle
med() { python3 bench/runs.py speed "$1" --skip 4 | grep -oE '"median_ms": [0-9.]+' | grep -oE '[0-9.]+$'; }
mkdir -p $O/runs
echo "== statistics cost, interleaved rounds: delayed with statistics / without (median ms)"
for i in 1 2 3; do
  s=$(timeout 60 bin/fp8-capture train --quiet --device cuda --preset seed --batch 32 --recipe delayed --steps 12 --out $O/runs/bs-$i > /dev/null 2>&1; med $O/runs/bs-$i)
  n=$(timeout 60 bin/fp8-capture train --quiet --device cuda --preset seed --batch 32 --recipe delayed --stats-every 0 --steps 12 --out $O/runs/bn-$i > /dev/null 2>&1; med $O/runs/bn-$i)
  echo "seed b32 round $i: stats $s nostats $n ratio $(python3 -c "print(round($s/$n,4))")"
done
for i in 1 2; do
  s=$(timeout 60 bin/fp8-capture train --quiet --device cuda --preset llama-1b --recipe delayed --steps 10 --out $O/runs/ls-$i > /dev/null 2>&1; med $O/runs/ls-$i)
  n=$(timeout 60 bin/fp8-capture train --quiet --device cuda --preset llama-1b --recipe delayed --stats-every 0 --steps 10 --out $O/runs/ln-$i > /dev/null 2>&1; med $O/runs/ln-$i)
  echo "llama-1b round $i: stats $s nostats $n ratio $(python3 -c "print(round($s/$n,4))")"
done
rm -rf $O/runs
