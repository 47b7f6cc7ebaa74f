set -u
O=$OUT
cd gpu-bundle
echo "== new cuda_layers"
timeout 120 bin/cuda_layers --nocapture --test-threads 1 > $O/cuda_layers.txt 2>&1; echo "rc $?"
grep -E "test result|FAILED|panicked" $O/cuda_layers.txt | head -8
echo "== every table, old vs new (dump_shadow_check)"
timeout 120 bash bench/dump_shadow_check.sh old bin $O/dsc cuda > $O/dsc.txt 2>&1; echo "rc $?"; grep -E '^(small|llama-small):' $O/dsc.txt | cut -c1-300
rm -rf $O/dsc
echo "== speed.sh llama"
timeout 300 bash bench/speed.sh bin $O/speed-llama llama > $O/speed-llama.log 2>&1; echo "rc $?"; tail -14 $O/speed-llama.log
echo "== speed.sh b32"
timeout 200 bash bench/speed.sh bin $O/speed-b32 b32 > $O/speed-b32.log 2>&1; echo "rc $?"; tail -10 $O/speed-b32.log
cp $O/speed-llama/benchmarks_rows.md $O/rows-llama.md 2>/dev/null; cp $O/speed-b32/benchmarks_rows.md $O/rows-b32.md 2>/dev/null
ls $O/speed-llama | head -30 > $O/speed-llama-files.txt
for d in $O/speed-llama $O/speed-b32; do find $d -mindepth 1 -type d -exec rm -rf {} + 2>/dev/null; done
