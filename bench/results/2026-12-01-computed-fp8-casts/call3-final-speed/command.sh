set -u
O=$OUT
cd gpu-bundle
echo "== speed.sh llama"
timeout 330 bash bench/speed.sh bin $O/speed-llama llama > $O/speed-llama.log 2>&1; echo "rc $?"; tail -14 $O/speed-llama.log
echo "== speed.sh b32"
timeout 220 bash bench/speed.sh bin $O/speed-b32 b32 > $O/speed-b32.log 2>&1; echo "rc $?"; tail -10 $O/speed-b32.log
cp $O/speed-llama/benchmarks_rows.md $O/rows-llama.md 2>/dev/null; cp $O/speed-b32/benchmarks_rows.md $O/rows-b32.md 2>/dev/null
for d in $O/speed-llama $O/speed-b32; do find $d -mindepth 1 -type d -exec rm -rf {} + 2>/dev/null; done
