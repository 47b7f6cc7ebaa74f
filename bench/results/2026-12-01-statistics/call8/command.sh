set -u
O=$OUT
cd gpu-bundle
echo "== alt cuda_layers"
timeout 100 alt/cuda_layers --nocapture --test-threads 1 > $O/alt_cuda_layers.txt 2>&1; echo "rc $?"
grep -E "test result|FAILED|panicked" $O/alt_cuda_layers.txt | head -5
echo "== every table, new vs alt (dump_shadow_check)"
timeout 120 bash bench/dump_shadow_check.sh bin alt $O/dsc cuda 2>&1 | tail -3
echo "== speed llama-1b 12 steps"
for spec in "new delayed" "alt delayed" "new delayed --stats-every 0" "alt delayed --stats-every 0"; do
  set -- $spec; v=$1; r=$2; shift 2; tag="$r${1:+-nostats}-$v"
  bin=bin; [ $v = alt ] && bin=alt
  timeout 100 $bin/fp8-capture train --quiet --device cuda --preset llama-1b --recipe $r "$@" --steps 12 --out $O/runs/$tag > $O/$tag.txt 2>&1
  echo "-- $tag: $(python3 bench/runs.py speed $O/runs/$tag --skip 4 | grep -oE '"median_ms": [0-9.]+')"
done
python3 bench/runs.py same $O/runs/delayed-new $O/runs/delayed-alt
python3 bench/runs.py tables $O/runs/delayed-new $O/runs/delayed-alt
