set -u
O=$OUT
cd gpu-bundle
echo "== gpu_check.sh's parity and determinism for llama-small (the part call3's time limit cut), bin ($(cat .git-head))"
R=/tmp/pr; mkdir -p $R
cap() { bin/fp8-capture train --quiet "$@"; }
for r in bf16 delayed; do
  cap --device cpu --preset llama-small --recipe $r --steps 100 --out $R/$r-cpu &
  cap --device cuda --preset llama-small --recipe $r --steps 100 --out $R/$r-gpu
  cap --device cuda --preset llama-small --recipe $r --steps 100 --out $R/$r-gpu2
  wait
  python3 bench/runs.py parity $R/$r-cpu $R/$r-gpu | tee -a $O/checks-llama-small.jsonl
  python3 bench/runs.py same $R/$r-gpu $R/$r-gpu2 | tee -a $O/checks-llama-small.jsonl
done
echo "== speed.sh b32"
timeout 300 bash bench/speed.sh bin $O/speed-b32 b32 > $O/speed-b32.log 2>&1; echo "rc $?"; tail -14 $O/speed-b32.log
cp $O/speed-b32/benchmarks_rows.md $O/rows-b32.md 2>/dev/null; cp $O/speed-b32/speed.jsonl $O/speed-b32.jsonl 2>/dev/null
rm -rf $O/speed-b32
