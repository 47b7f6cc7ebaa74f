#!/usr/bin/env bash
# Ranks sharing one GPU against one rank (issue 55): `fp8-capture train --device cuda` with --dp 2,
# --tp 2 and the dp 2 × tp 2 mesh, against one rank of the same seed on the same GPU, on `small`
# and `llama-small`, in bf16 and delayed scaling. Per pair (bench/runs.py ranks): the loss's
# relative difference at step 1, the largest (and where), steps over 0.1%, the final loss's, whether
# every step is bit-identical, and step 1's activation and gradient amaxes reduced over the ranks
# against one rank's. Then a rank planted to die: the job's status, exit code and seconds to end.
# Usage: bench/gpu_ranks.sh BIN_DIR OUT_DIR [STEPS]   (BIN_DIR holds fp8-capture; default 200 steps)
set -uo pipefail
BIN=${1:?bin dir}; OUT=${2:?out dir}; STEPS=${3:-200}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT/runs"
status=0
cap() { "$BIN/fp8-capture" train --quiet --device cuda --seed 0 --steps "$STEPS" "$@"; }
for p in small llama-small; do
  for r in bf16 delayed; do
    cap --preset $p --recipe $r --out "$OUT/runs/$p-$r-one" || status=1
    layouts="dp2 tp2"
    [ "$r" = delayed ] && layouts="dp2 tp2 dp2tp2"
    for l in $layouts; do
      case $l in dp2) f=(--dp 2);; tp2) f=(--tp 2);; dp2tp2) f=(--dp 2 --tp 2);; esac
      t0=$(date +%s.%N)
      cap --preset $p --recipe $r "${f[@]}" --out "$OUT/runs/$p-$r-$l" || status=1
      secs=$(python3 -c "import time; print(round(time.time() - $t0, 1))")
      echo "== $p $r $l ($secs s)"
      python3 "$HERE/runs.py" ranks "$OUT/runs/$p-$r-one" "$OUT/runs/$p-$r-$l" | tee -a "$OUT/ranks.jsonl" || status=1
    done
  done
done
echo "== a rank that dies: small, delayed, --dp 2, rank 1 at step 50"
t0=$(date +%s.%N)
cap --preset small --recipe delayed --dp 2 --inject kind=rank-dies,rank=1,step=50 --out "$OUT/runs/dies"
code=$?
secs=$(python3 -c "import time; print(round(time.time() - $t0, 1))")
python3 - "$OUT/runs/dies/run.json" "$code" "$secs" <<'PY' | tee -a "$OUT/ranks.jsonl" || status=1
import json, sys
m = json.load(open(sys.argv[1]))
ok = m["status"] == "crashed" and "rank 1" in (m.get("error") or "") and int(sys.argv[2]) != 0 and float(sys.argv[3]) < 30
print(json.dumps({"check": "rank-dies", "status": m["status"], "error": m.get("error"), "exit": int(sys.argv[2]), "seconds": float(sys.argv[3]), "pass": ok}))
sys.exit(0 if ok else 1)
PY
echo "== gpu_ranks status $status"
exit $status
