#!/usr/bin/env bash
# What the README promises a newcomer, checked on a clean clone. Clones the repository (default: the
# committed HEAD of this checkout; uncommitted changes are not in it) into WORKDIR, runs the README's
# two commands as a newcomer does — `cargo run --release`, then `bash .ci/run` — with no
# CARGO_TARGET_DIR, no CI and no compiler wrapper set, and prints their times beside the README's.
# Fails when
#   - a command fails;
#   - the demo does not print its verdict and where the runs and the report are, or does not write
#     them (verdict.json naming the anomaly, the culprit GEMMs and runs for the baseline, the FP8
#     run, each GEMM kind, the bisection and current scaling; report/index.html with its charts);
#   - `bash .ci/run` does not build in the clone's target/ or compiles polars, arrow or parquet
#     again (the two commands share one build);
#   - on a 2-core machine (the README's), a measured time is off the README's by more than 25%.
# It pays the full first build (the README gives its time): run it with nothing else
# building. Crates already downloaded to ~/.cargo are not downloaded again.
# Usage: bench/fresh_clone.sh [REPO [WORKDIR]]   (WORKDIR, kept for inspection: a new mktemp -d)
set -uo pipefail
export LC_NUMERIC=C   # a '.' in $EPOCHREALTIME
HERE=$(cd "$(dirname "$0")/.." && pwd)
REPO=${1:-$HERE}
WORK=${2:-$(mktemp -d /tmp/fp8scope-fresh.XXXXXX)}
CLONE=$WORK/fp8scope
LOGS=$WORK/logs
mkdir -p "$LOGS"
[ -e "$CLONE" ] && { echo "fresh_clone.sh: $CLONE exists; give an empty WORKDIR" >&2; exit 2; }
git clone --quiet "$REPO" "$CLONE" || { echo "fresh_clone.sh: git clone $REPO failed" >&2; exit 2; }
echo "clone of $REPO at $(git -C "$CLONE" rev-parse --short HEAD) in $CLONE; logs in $LOGS; $(nproc) cores"

FAILS=()
fail() { FAILS+=("$1"); echo "FAIL: $1"; }
# Prefixes every line with the time it arrived (seconds since the epoch), so that one log gives the
# time of each phase.
stamp() { while IFS= read -r line; do printf '%s %s\n' "$EPOCHREALTIME" "$line"; done; }
# A newcomer's environment: no target directory, CI flag or compiler wrapper from this machine.
newcomer() { (cd "$CLONE" && env -u CARGO_TARGET_DIR -u CARGO_BUILD_TARGET_DIR -u CI -u RUSTC_WRAPPER \
  -u CARGO_BUILD_RUSTC_WRAPPER -u FP8SCOPE_CAPTURE "$@"); }
# The arrival time of the first line of LOG matching the regular expression RE (empty if none).
at() { grep -m1 -E "^[0-9.]+ $2" "$1" | cut -d' ' -f1; }
mins() { python3 -c "import sys; print(f'{(float(sys.argv[2]) - float(sys.argv[1])) / 60:.1f}')" "$1" "$2"; }

# 1. cargo run --release: the first build, then the demo.
echo "== cargo run --release (first build, then the demo)"
t0=$EPOCHREALTIME
newcomer cargo run --release 2>&1 | stamp > "$LOGS/cargo-run.log"
rc=${PIPESTATUS[0]}
t1=$EPOCHREALTIME
tail -5 "$LOGS/cargo-run.log" | cut -d' ' -f2-
[ "$rc" -eq 0 ] || fail "cargo run --release exited $rc (see $LOGS/cargo-run.log)"
t_run=$(at "$LOGS/cargo-run.log" ' *Running `')
[ -n "$t_run" ] || { fail "cargo run --release never started the demo"; t_run=$t1; }
build_min=$(mins "$t0" "$t_run"); demo_min=$(mins "$t_run" "$t1")

# What the demo promises to print (src/main.rs) and write.
out=$(cut -d' ' -f2- "$LOGS/cargo-run.log")
for want in '^fp8scope demo: triage of the built-in drift scenario on the tiny preset$' \
            '^== fp8-analyze triage --preset tiny --scenario drift --out runs/demo-[0-9]+/triage$' \
            '^== fp8-analyze report ' \
            '^Every run triage recorded is under runs/demo-[0-9]+/triage; its verdict is in runs/demo-[0-9]+/triage/verdict\.txt\.$' \
            '^Open runs/demo-[0-9]+/report/index\.html to see the report\.$'; do
  grep -qE "$want" <<<"$out" || fail "the demo did not print a line matching /$want/"
done
demo=$(grep -oE '^Open runs/demo-[0-9]+' <<<"$out" | head -1 | cut -d' ' -f2)
if [ -n "$demo" ]; then
  python3 - "$CLONE" "$demo" "$out" <<'PY' || fail "the demo's files (see above)"
import json, os, sys
clone, printed = sys.argv[1], sys.argv[3]
root = os.path.join(clone, sys.argv[2])
bad = []
need = ["triage/verdict.json", "triage/verdict.txt", "report/index.html", "report/report.json", "report/loss.png"]
bad += [f"{root}/{f} missing" for f in need if not os.path.isfile(os.path.join(root, f))]
try:
    v = json.load(open(os.path.join(root, "triage/verdict.json")))
    purposes = [r.get("outcome", {}).get("purpose") for r in v.get("runs", [])]
    for p, n in [("baseline", 1), ("fp8", 1), ("kind", 3), ("current", 1), ("bisect", 1)]:
        if purposes.count(p) < n:
            bad.append(f"verdict.json: {purposes.count(p)} run(s) of purpose {p!r}, want at least {n}")
    missing = [r["dir"] for r in v.get("runs", []) if r.get("dir") and not os.path.isdir(os.path.join(clone, r["dir"]))]
    bad += [f"run directory {d} missing" for d in missing]
    if v.get("anomaly") != "drift":
        bad.append(f"verdict.json: anomaly {v.get('anomaly')!r}, the README promises drift")
    if not v.get("culprits"):
        bad.append("verdict.json: no culprit GEMMs")
    print(f"demo verdict: anomaly {v.get('anomaly')}, culprits {v.get('culprits')}, current scaling cures: {v.get('current_scaling_cures')}, {len(purposes)} runs")
except Exception as e:
    bad.append(f"verdict.json unreadable: {e}")
try:
    first = next(l for l in open(os.path.join(root, "triage/verdict.txt")).read().splitlines() if l.strip())
    if first.strip() not in printed:
        bad.append("the verdict (verdict.txt) was not printed")
except Exception as e:
    bad.append(f"verdict.txt unreadable: {e}")
pngs = [f for f in os.listdir(os.path.join(root, "report")) if f.endswith(".png")] if os.path.isdir(os.path.join(root, "report")) else []
if len(pngs) < 2:
    bad.append(f"report/: {len(pngs)} PNG chart(s)")
for b in bad:
    print("  " + b)
sys.exit(1 if bad else 0)
PY
fi

# 2. bash .ci/run: must reuse the build of step 1.
echo "== bash .ci/run"
t2=$EPOCHREALTIME
newcomer bash .ci/run 2>&1 | stamp > "$LOGS/ci-run.log"
rc=${PIPESTATUS[0]}
t3=$EPOCHREALTIME
python3 - "$LOGS/ci-run.log" <<'PY'
import re, sys
n = [0, 0, 0]
for l in open(sys.argv[1], errors="replace"):
    m = re.search(r"test result: \w+\. (\d+) passed; (\d+) failed; (\d+) ignored", l)
    if m:
        n = [a + int(b) for a, b in zip(n, m.groups())]
print(f"tests: {n[0]} passed, {n[1]} failed, {n[2]} ignored")
PY
[ "$rc" -eq 0 ] || fail "bash .ci/run exited $rc (see $LOGS/ci-run.log)"
t_b=$(at "$LOGS/ci-run.log" '== building the workspace'); t_t=$(at "$LOGS/ci-run.log" '== running the tests')
# Where a plain `cargo run --release` in the clone builds (its target/, unless a cargo configuration says otherwise).
want_dir=$(newcomer cargo metadata --no-deps --format-version 1 | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
grep -qF "target dir $want_dir)" "$LOGS/ci-run.log" || fail "bash .ci/run did not build in $want_dir: $(grep -m1 'target dir' "$LOGS/ci-run.log" | cut -d' ' -f2-)"
again=$(grep -oE 'Compiling [A-Za-z0-9_-]+ v[^ ]+' "$LOGS/ci-run.log" | sort -u)
echo "compiled by bash .ci/run: $(echo $again | sed 's/Compiling //g')"
grep -qE 'Compiling (polars|arrow|parquet)' <<<"$again" && fail "bash .ci/run compiled polars, arrow or parquet again: the two commands did not share one build"

# 3. The times, beside the README's.
readme_min() { tr -s ' \n' '  ' < "$CLONE/README.md" | grep -oE "$1" | grep -oE '[0-9]+(\.[0-9]+)?' | head -1; }
said_build=$(readme_min 'The first build compiles polars: [0-9.]+ min')
said_demo=$(readme_min 'demo then runs in [0-9.]+ min')
ci_build=$([ -n "$t_b" ] && [ -n "$t_t" ] && mins "$t_b" "$t_t" || echo n/a)
ci_tests=$([ -n "$t_t" ] && mins "$t_t" "$t3" || echo n/a)
echo
echo "| step | measured (min) | README (min) |"
echo "| --- | --- | --- |"
echo "| cargo run --release: first build | $build_min | ${said_build:-not stated} |"
echo "| cargo run --release: demo | $demo_min | ${said_demo:-not stated} |"
echo "| bash .ci/run: build | $ci_build | |"
echo "| bash .ci/run: tests | $ci_tests | |"
echo "| bash .ci/run: total (with installs) | $(mins "$t2" "$t3") | |"
echo "($(nproc) cores; the README's figures are for 2)"
off() { python3 -c "import sys; sys.exit(0 if abs(float(sys.argv[1]) / float(sys.argv[2]) - 1) > 0.25 else 1)" "$1" "$2"; }
if [ "$(nproc)" -eq 2 ]; then
  for pair in "first build:$build_min:$said_build" "demo:$demo_min:$said_demo"; do
    IFS=: read -r what got said <<<"$pair"
    if [ -z "$said" ]; then fail "the README states no $what time"
    elif off "$got" "$said"; then fail "$what took $got min; the README says $said min"; fi
  done
fi

echo
if [ ${#FAILS[@]} -eq 0 ]; then echo "fresh clone: everything the README promises held"; exit 0; fi
echo "fresh clone: ${#FAILS[@]} promise(s) broken:"; printf '  - %s\n' "${FAILS[@]}"; exit 1
