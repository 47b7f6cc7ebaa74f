#!/usr/bin/env bash
# Speed of fp8-capture on the GPU against the PyTorch peer (torch_tiny.py), side by side in one call,
# so that only same-run ratios are compared (the machine varies ±20% between calls).
# Prints one table and writes it as Markdown rows to OUT_DIR/benchmarks_rows.md.
# Usage: bench/speed.sh BIN_DIR OUT_DIR [quick|nolong]
#   quick: the b4 runs only; nolong: everything but the two 1000-step training runs.
set -uo pipefail
BIN=${1:?bin dir}; OUT=${2:?out dir}; QUICK=${3:-}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT/runs"
RES="$OUT/speed.jsonl"; : > "$RES"
peak_start() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$OUT/mem.log" 2>/dev/null & MEMPID=$!; }
peak_stop() { kill $MEMPID 2>/dev/null; wait $MEMPID 2>/dev/null; sort -n "$OUT/mem.log" | tail -1; }
cap() {  # name steps skip args...
  local name=$1 steps=$2 skip=$3; shift 3
  peak_start
  "$BIN/fp8-capture" train --quiet --device cuda --preset seed --steps "$steps" --out "$OUT/runs/$name" "$@" > "$OUT/runs/$name.log" 2>&1
  local rc=$? mem; mem=$(peak_stop)
  if [ $rc -ne 0 ]; then echo "{\"run\": \"$name\", \"error\": \"rc $rc: $(tail -1 "$OUT/runs/$name.log" | tr -d '\"')\"}" | tee -a "$RES"; return; fi
  python3 "$HERE/runs.py" speed "$OUT/runs/$name" --skip "$skip" | python3 -c "import json,sys; d=json.load(sys.stdin); d['run']='$name'; d['peak_mib']=int('${mem:-0}' or 0); print(json.dumps(d))" | tee -a "$RES"
}
torch_peer() {  # variant batch
  peak_start
  python3 "$HERE/torch_tiny.py" --variant "$1" --batch "$2" --warmup 10 --steps 30 > "$OUT/torch_$1_$2.log" 2>&1
  local mem; mem=$(peak_stop)
  grep '^RESULT' "$OUT/torch_$1_$2.log" | sed 's/^RESULT //' | python3 -c "import json,sys; d=json.load(sys.stdin); d['run']='torch_$1_b$2'; d['median_ms']=d['ms_step']; d['peak_mib']=int('${mem:-0}' or 0); print(json.dumps(d))" | tee -a "$RES" \
    || echo "{\"run\": \"torch_$1_b$2\", \"error\": \"$(tail -1 "$OUT/torch_$1_$2.log" | tr -d '\"')\"}" | tee -a "$RES"
}
export PYTHONUNBUFFERED=1
S=60; [ "$QUICK" = quick ] && S=25
torch_peer compile_fused 4
cap seed-bf16 $S 10 --recipe bf16
cap seed-delayed $S 10 --recipe delayed
cap seed-delayed-nostats $S 10 --recipe delayed --stats-every 0
if [ "$QUICK" != quick ]; then
  cap seed-delayed-dump 200 0 --recipe delayed --dump-every 50 --dump-layers 'layers\.5\.fc1'
  cap seed-delayed-nodump 200 0 --recipe delayed
  torch_peer compile_fused 32
  cap seed-bf16-b32 30 10 --recipe bf16 --batch 32
  cap seed-delayed-b32 30 10 --recipe delayed --batch 32
  if [ "$QUICK" != nolong ]; then
    cap seed-bf16-1000 1000 10 --recipe bf16
    cap seed-delayed-1000 1000 10 --recipe delayed
    # Where the FP8 gap comes from: the same run with a short amax history, and current scaling.
    cap seed-delayed-h16-1000 1000 10 --recipe delayed --amax-history 16
    cap seed-current-1000 1000 10 --recipe current
    for r in seed-bf16-1000 seed-delayed-1000 seed-delayed-h16-1000 seed-current-1000; do python3 "$HERE/runs.py" final "$OUT/runs/$r" | tee -a "$OUT/final.jsonl"; done
  fi
fi
python3 - "$RES" "$OUT/benchmarks_rows.md" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {r["run"]: r for r in rows}
def ms(n): return by.get(n, {}).get("median_ms")
out = ["| run | ms/step (median) | tokens/step | peak GPU MiB | note |", "| --- | --- | --- | --- | --- |"]
for r in rows:
    note = r.get("error", "")
    out.append(f"| {r['run']} | {r.get('median_ms', 'n/a')} | {r.get('tokens', r.get('batch', '') and r.get('batch', 0) * 512)} | {r.get('peak_mib', '')} | {note} |")
def ratio(a, b):
    return f"{ms(a) / ms(b):.3f}" if ms(a) and ms(b) else "n/a"
out.append("")
out.append(f"- bf16 vs torch.compile (b4): ours/theirs = {ratio('seed-bf16', 'torch_compile_fused_b4')} (target <= 0.5)")
out.append(f"- FP8 delayed speed-up over our bf16 (b4): {ratio('seed-bf16', 'seed-delayed')} (target >= 1.05)")
out.append(f"- FP8 delayed speed-up over our bf16 (b32): {ratio('seed-bf16-b32', 'seed-delayed-b32')} (target >= 1.4)")
out.append(f"- stats every step vs none: {ratio('seed-delayed', 'seed-delayed-nostats')} (target <= 1.03)")
d, nd = by.get("seed-delayed-dump", {}), by.get("seed-delayed-nodump", {})
if d.get("mean_ms") and nd.get("mean_ms"):
    out.append(f"- dump of one layer every 50 steps, mean over 200 steps: {d['mean_ms'] / nd['mean_ms']:.3f} (target <= 1.05)")
text = "\n".join(out)
print(text)
open(sys.argv[2], "w").write(text + "\n")
PY
