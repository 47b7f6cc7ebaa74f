#!/usr/bin/env bash
# The loss llama-small reaches on real English text on the GPU: Debian's fortunes corpus (the files
# make_tokenizer.py trained on), tokenized by capture/tests/fixtures/tokenizer/fortunes-bpe-4096.json,
# BF16 and FP8 delayed, STEPS steps (default 600). Prints each run's final loss and the FP8 gap.
# Usage: bench/llama_text_gpu.sh BIN_DIR CORPUS_DIR OUT_DIR [STEPS] [TOKENIZER]   (run from the
# repository root, or give TOKENIZER)
set -euo pipefail
BIN=${1:?bin dir}; CORPUS=${2:?corpus dir}; OUT=${3:?out dir}; STEPS=${4:-600}
TOK=${5:-capture/tests/fixtures/tokenizer/fortunes-bpe-4096.json}
FILES=$(ls "$CORPUS" | grep -v '\.' | sed "s|^|$CORPUS/|" | paste -sd, -)
mkdir -p "$OUT"
for r in bf16 delayed; do
  "$BIN/fp8-capture" train --quiet --device cuda --preset llama-small --recipe $r --steps "$STEPS" \
    --data text --text "$FILES" --tokenizer "$TOK" --out "$OUT/llama-small-text-$r"
done
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
f = {r: json.load(open(f"{out}/llama-small-text-{r}/run.json"))["final_loss"] for r in ("bf16", "delayed")}
print(json.dumps({"check": "llama_small_text", "final_loss_bf16": f["bf16"], "final_loss_fp8": f["delayed"],
                  "fp8_gap_pct": 100 * (f["delayed"] / f["bf16"] - 1)}))
PY
