set -u
O=$OUT
cd gpu-bundle
echo "== cuda_layers (every test)"
timeout 150 bin/cuda_layers --nocapture --test-threads 1 > $O/cuda_layers.txt 2>&1; echo "rc $?"
grep -E "test result|FAILED|panicked|^test .*(ok|FAILED)$" $O/cuda_layers.txt | head -20
echo "== speed.sh llama"
timeout 300 bash bench/speed.sh bin $O/speed-llama llama > $O/speed-llama.log 2>&1; echo "rc $?"; tail -14 $O/speed-llama.log
cp $O/speed-llama/benchmarks_rows.md $O/rows-llama.md 2>/dev/null
find $O/speed-llama -mindepth 1 -type d -exec rm -rf {} + 2>/dev/null
