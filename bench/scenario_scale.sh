#!/usr/bin/env bash
# Does a built-in scenario's effect grow with the model? Trains the scenario under bf16, delayed
# (the scenario's recipe) and current scaling on the GPU for each preset given, and prints the
# loss around the scenario's planted batch and at the end (mean of the last 20 steps).
# Usage: bench/scenario_scale.sh BIN OUT SCENARIO STEPS PRESET...
set -uo pipefail
BIN=${1:?bin dir}; OUT=${2:?out dir}; SCEN=${3:?scenario}; STEPS=${4:?steps}; shift 4
for preset in "$@"; do
  for r in bf16 delayed current; do
    "$BIN/fp8-capture" train --quiet --device cuda --preset "$preset" --scenario "$SCEN" --recipe "$r" \
      --steps "$STEPS" --out "$OUT/$preset-$r" > "$OUT/$preset-$r.log" 2>&1 || echo "$preset $r: rc $?"
  done
  python3 - "$OUT" "$preset" <<'PY'
import glob, os, sys
import pyarrow.parquet as pq
out, preset = sys.argv[1], sys.argv[2]
def loss(run):
    rows = {}
    for p in sorted(glob.glob(os.path.join(run, "steps", "part-*.parquet"))):
        t = pq.read_table(p, columns=["step", "loss"]).to_pydict()
        rows.update(zip(t["step"], t["loss"]))
    return rows
runs = {r: loss(os.path.join(out, f"{preset}-{r}")) for r in ["bf16", "delayed", "current"]}
steps = sorted(runs["bf16"])
# The planted batch is the step whose BF16 loss is 0 (no supervised target); else around step 150.
planted = next((s for s in steps if runs["bf16"][s] == 0.0), 150)
print(f"== {preset}: loss per step around the planted batch (step {planted}), and the final mean of 20 steps")
print("step " + " ".join(f"{r:>9}" for r in runs))
for s in [s for s in steps if planted - 5 <= s <= planted + 15]:
    print(f"{s:>4} " + " ".join(f"{runs[r].get(s, float('nan')):9.4f}" for r in runs))
tail = {r: sum(list(v.values())[-20:]) / 20 for r, v in runs.items()}
print("final " + " ".join(f"{tail[r]:9.4f}" for r in runs), f" (delayed {100*(tail['delayed']/tail['bf16']-1):+.2f}%)")
PY
done
