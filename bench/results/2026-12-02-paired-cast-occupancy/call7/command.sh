set -u
O=$OUT
cd gpu-bundle
echo "== speed.sh b32 (statistics cost over three pairs)"
timeout 200 bash bench/speed.sh bin $O/speed-b32 b32 > $O/speed-b32.log 2>&1; echo "rc $?"
cp $O/speed-b32/benchmarks_rows.md $O/rows-b32.md 2>/dev/null; cat $O/rows-b32.md
find $O/speed-b32 -mindepth 1 -type d -exec rm -rf {} + 2>/dev/null
