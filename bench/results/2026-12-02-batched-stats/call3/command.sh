set -u
O=$OUT
cd gpu-bundle
echo "== ncu: the paired cast at the cheap level, v2 (4 blocks by registers) and bin (v2 + the most shared memory)"
for v in v2 bin; do
  timeout 150 ncu --clock-control none -k "regex:^cast_src5_l1_f2$" --launch-skip 40 --launch-count 1 --section LaunchStats --section Occupancy --section SpeedOfLight \
    $v/fp8-capture train --quiet --device cuda --preset llama-1b --recipe delayed --steps 4 --out $O/ncurun-$v > $O/ncu-$v.txt 2>&1; echo "ncu $v rc $?"
  grep -E "Duration|Registers Per|Block Limit|Achieved Occupancy|Theoretical Occupancy|Shared Memory Configuration|Driver Shared|Static Shared" $O/ncu-$v.txt
  rm -rf $O/ncurun-$v
done
med() { python3 bench/runs.py speed "$1" --skip 4 | grep -oE '"median_ms": [0-9.]+' | grep -oE '[0-9.]+$'; }
mkdir -p $O/runs
echo "== llama-1b delayed with statistics, 10 steps, median ms: base (d2b9ca2) / bin"
for i in 1 2; do line="round $i:"; for v in base bin; do
  timeout 100 $v/fp8-capture train --quiet --device cuda --preset llama-1b --recipe delayed --steps 10 --out $O/runs/$v-$i > $O/runs/$v-$i.log 2>&1
  line="$line $v $(med $O/runs/$v-$i)"
done; echo "$line"; done
echo -n "loss base vs bin: "; python3 bench/runs.py same $O/runs/base-1 $O/runs/bin-1
echo "== seed b32 delayed with statistics, 12 steps"
for i in 1 2; do line="round $i:"; for v in base bin; do
  timeout 100 $v/fp8-capture train --quiet --device cuda --preset seed --batch 32 --recipe delayed --steps 12 --out $O/runs/b32-$v-$i > $O/runs/b32-$v-$i.log 2>&1
  line="$line $v $(med $O/runs/b32-$v-$i)"
done; echo "$line"; done
FP8SCOPE_PROFILE=1 timeout 100 bin/fp8-capture train --quiet --device cuda --preset llama-1b --recipe delayed --steps 8 --out $O/runs/p > $O/profile_llama.txt 2>&1
grep -E "^  (gemm|total)" $O/profile_llama.txt
rm -rf $O/runs
