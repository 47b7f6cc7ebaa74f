#!/usr/bin/env bash
# Tensor parallelism against one rank on the CPU (issue 55): `fp8-capture train --tp 2` (and the
# dp 2 × tp 2 mesh) against one rank, same seed and data, on tiny and llama-tiny, in bf16 and
# delayed scaling. Prints per pair the relative loss difference at step 1, the largest over every
# step (and where), how many steps exceed 0.1%, the final loss's (mean of the last 20 steps)
# difference, and whether every step's loss is bit-identical. capture/README.md holds the figures
# of the default 200 steps. Needs python3 with pyarrow (tests/requirements.txt).
# Usage: bench/tp_equivalence.sh [STEPS] [OUT_DIR]   (defaults 200, /tmp/fp8scope-tp-equivalence;
# FP8_CAPTURE=PATH runs that binary instead of building one)
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/fp8scope-target}
STEPS=${1:-200}
OUT=${2:-/tmp/fp8scope-tp-equivalence}
BIN=${FP8_CAPTURE:-$CARGO_TARGET_DIR/release/fp8-capture}
[ -n "${FP8_CAPTURE:-}" ] || cargo build --release --workspace --quiet
rm -rf "$OUT" && mkdir -p "$OUT"

compare() {
  python3 - "$1" "$2" <<'PY'
import glob, sys, pyarrow.parquet as pq
def losses(run):
    out = {}
    for f in glob.glob(run + "/steps/**/*.parquet", recursive=True):
        t = pq.read_table(f, columns=["step", "loss"]).to_pydict()
        for s, l in zip(t["step"], t["loss"]):
            assert out.setdefault(s, l) == l, f"step {s}: the ranks disagree on the loss"
    return out
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert sorted(a) == sorted(b), "the runs have different steps"
steps = sorted(a)
gap = {s: abs(b[s] - a[s]) / abs(a[s]) for s in steps}
worst = max(steps, key=lambda s: gap[s])
tail = steps[-20:]
fa, fb = sum(a[s] for s in tail) / len(tail), sum(b[s] for s in tail) / len(tail)
print(f"step 1 {gap[steps[0]]:.1e}  largest {gap[worst]:.1e} (step {worst})  steps > 0.1%: {sum(g > 1e-3 for g in gap.values())}"
      f"  final loss {abs(fb - fa) / fa:.1e}  bit-identical: {all(a[s] == b[s] for s in steps)}")
PY
}

for preset in tiny llama-tiny; do
  for recipe in bf16 delayed; do
    common=(train --preset "$preset" --recipe "$recipe" --device cpu --steps "$STEPS" --seed 0 --quiet)
    "$BIN" "${common[@]}" --out "$OUT/$preset-$recipe-one"
    "$BIN" "${common[@]}" --tp 2 --out "$OUT/$preset-$recipe-tp2"
    echo "$preset $recipe, tp 2:      $(compare "$OUT/$preset-$recipe-one" "$OUT/$preset-$recipe-tp2")"
    if [ "$recipe" = delayed ]; then
      "$BIN" "${common[@]}" --dp 2 --tp 2 --out "$OUT/$preset-$recipe-dp2tp2"
      echo "$preset $recipe, dp 2 × tp 2: $(compare "$OUT/$preset-$recipe-one" "$OUT/$preset-$recipe-dp2tp2")"
    fi
  done
done
