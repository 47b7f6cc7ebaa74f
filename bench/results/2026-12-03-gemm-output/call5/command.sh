# Call 5: the seed b32 targets side by side with torch.compile (bench/speed.sh, the new binary).
set -u
cd gpu-bundle
timeout 280 bash bench/speed.sh bin $OUT/speed b32 > $OUT/b32.txt 2>&1; echo "rc $?"
grep -E "target|ours/theirs|ratio|stats" $OUT/b32.txt | head -30
