set -u
O=$OUT
cd gpu-bundle
echo "== gpu_check.sh on bin ($(cat .git-head 2>/dev/null))"
timeout 240 bash bench/gpu_check.sh bin $O/check > $O/gpu_check.txt 2>&1; echo "rc $?"; tail -12 $O/gpu_check.txt
cp $O/check/checks.jsonl $O/checks.jsonl 2>/dev/null; rm -rf $O/check
echo "== speed.sh llama"
timeout 330 bash bench/speed.sh bin $O/speed-llama llama > $O/speed-llama.log 2>&1; echo "rc $?"; tail -16 $O/speed-llama.log
cp $O/speed-llama/benchmarks_rows.md $O/rows-llama.md 2>/dev/null; cp $O/speed-llama/speed.jsonl $O/speed-llama.jsonl 2>/dev/null
rm -rf $O/speed-llama
