set -u
cd gpu-bundle
echo "== cuda_layers"
timeout 100 bin/cuda_layers --nocapture --test-threads 1 > $OUT/cuda_layers.txt 2>&1; echo "rc $?"
grep -E "test result|FAILED|panicked|^test rope" $OUT/cuda_layers.txt | head -6
echo "== every table, old (c7fc0fa) vs new (dump_shadow_check)"
timeout 110 bash bench/dump_shadow_check.sh old bin $OUT/dsc cuda > $OUT/dsc.txt 2>&1; echo "rc $?"; grep -E '^(small|llama-small):' $OUT/dsc.txt | cut -c1-600
rm -rf $OUT/dsc
