#!/usr/bin/env bash
# Verdicts that hold up on a model of real size: `fp8-analyze triage --device cuda` on clean
# `seed`-preset runs (no planted fault, no scenario) of several seeds and lengths, each judged
# against its own noise band (BF16 replicas with --init-jitter). A clean run must come out
# healthy or inconclusive, never with a culprit. Prints one line per triage, keeps each
# verdict.txt / verdict.json and a table of every run's final loss and gap.
# Usage: bench/triage_noise_gpu.sh BIN OUT "SEED:STEPS ..." [JOBS]
#   BIN holds fp8-capture and fp8-analyze; OUT receives one folder per triage.
set -uo pipefail
BIN=${1:?bin dir}; OUT=${2:?out dir}; CASES=${3:-"0:600"}; JOBS=${4:-4}
mkdir -p "$OUT"
export PATH="$BIN:$PATH"
for c in $CASES; do
  seed=${c%%:*}; steps=${c##*:}
  d="$OUT/seed$seed-$steps"
  t0=$(date +%s.%N)
  fp8-analyze triage --preset seed --steps "$steps" --seed "$seed" --device cuda --jobs "$JOBS" --quiet --out "$d" > "$d.txt" 2>&1
  rc=$?
  secs=$(python3 -c "print(round($(date +%s.%N) - $t0, 1))")
  verdict=$(grep -m1 '^verdict:' "$d.txt" | cut -c1-160)
  echo "seed $seed, $steps steps: exit $rc in $secs s — $verdict"
  python3 - "$d/verdict.json" <<'PY'
import json, sys
try:
    v = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"   no verdict.json ({e})"); sys.exit()
n = v.get("noise") or {}
print(f"   healthy {v['healthy']} inconclusive {v['inconclusive']} anomaly {v['anomaly']} culprits {len(v['culprits'])} "
      f"band {100*n.get('final_gap', float('nan')):.2f}% / {n.get('horizontal_steps')} steps, {len(v['runs'])} runs")
for r in v["runs"]:
    o = r["outcome"]
    g = o.get("gap"); h = o.get("horizontal_steps"); q = o.get("gap_band_ratio")
    print(f"   {r['name']:<24} {o['purpose']:<17} loss {o['final_loss'] or float('nan'):8.4f} "
          f"gap {'-' if g is None else f'{100*g:+.2f}%':>8} {'-' if q is None else f'{q:.1f}x':>6} band "
          f"{'-' if h is None else f'{h:+.1f}':>7} steps  anomaly {o['anomaly']}")
PY
done
