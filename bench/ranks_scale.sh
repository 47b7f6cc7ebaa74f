#!/usr/bin/env bash
# `fp8-analyze ranks` on 1,024 ranks: generates (once) a run as the PyTorch recorder writes it — a
# dp 4 × fsdp 32 × tp 8 mesh, 16 layers of 4 sites, 200 steps in parts of 50, so that stats holds
# 384 rows per rank per step and casts 192 — with one planted fault per check (the ignored test
# analyze/tests/ranks_scale.rs), runs `fp8-analyze ranks RUN --json` under /usr/bin/time -v, and
# prints the wall time, peak RSS, the data's size (per table, per rank per step), whether every
# planted fault was named and nothing else, and the same data queried with DuckDB when its Python
# package is installed.
# Targets (issue 53): under a minute and under 2 GB on the 2-core build machine.
# Usage: bench/ranks_scale.sh [OUT_DIR]   (default /tmp/fp8scope-ranks-scale; REGENERATE=1 rewrites)
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/fp8scope-target}
OUT=${1:-/tmp/fp8scope-ranks-scale}
RUN=$OUT/ranks1024
BIN=$CARGO_TARGET_DIR/release/fp8-analyze

cargo build --release -p fp8-analyze --quiet
if [ ! -f "$RUN/run.json" ] || [ "${REGENERATE:-0}" = 1 ]; then
  echo "== generating $RUN"
  RANKS_SCALE_DIR=$OUT cargo test --release -p fp8-analyze --test ranks_scale --quiet -- --ignored --nocapture generate_1024_ranks
fi
sync

echo "== fp8-analyze ranks $RUN --json (cores: $(nproc))"
set +e
/usr/bin/time -v "$BIN" ranks "$RUN" --json > "$OUT/ranks.json" 2> "$OUT/time.txt"
rc=$?
set -e
echo "exit status $rc (1: findings)"
grep -E "Elapsed \(wall|Maximum resident|User time|System time" "$OUT/time.txt" | sed 's/^\s*/  /'

python3 - "$RUN" "$OUT/ranks.json" "$OUT/time.txt" <<'PY'
import json, os, re, sys
run, report, timing = sys.argv[1:4]
def size(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
j = json.load(open(report))
ranks, steps = j["world_size"], j["steps"]
total = size(run)
print(f"== data: {ranks} ranks × {steps} steps, {total / 1e9:.2f} GB in all, {total / ranks / steps:,.0f} bytes per rank per step")
for t in ("casts", "stats", "steps", "ranks"):
    s = size(os.path.join(run, t))
    print(f"  {t:6} {s / 1e9:6.2f} GB  {s / ranks / steps:8,.0f} B per rank per step")
t = open(timing).read()
wall = t.split("Elapsed (wall clock) time (h:mm:ss or m:ss): ")[1].split()[0]
m, s = wall.split(":")[-2:]
secs = int(m) * 60 + float(s)
rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", t).group(1)) / 1024
print(f"== fp8-analyze ranks: {secs:.1f} s wall, {rss:.0f} MiB peak RSS, {j['checked']['casts_rows']:,} casts rows and {j['checked']['stats_rows']:,} stats rows "
      f"({'met' if secs < 60 and rss < 2048 else 'MISSED'}: < 60 s and < 2 GB)")
expected = {
    ("scale_disagrees", "layers.7.fc2", "activation", (517,), 120),
    ("amax_group", "layers.7.fc2", "activation", (517,), 120),
    ("digest_disagrees", "layers.2.qkv", "weight", (300,), 60),
    ("forward_weight_mismatch", "layers.3.fc1", "weight", (12,), 40),
    ("stale_forward_weight", "layers.5.proj", "weight", (42,), 80),
    ("cast_mismatch", "layers.11.fc1", "gradient", (900,), 150),
    ("rank_outlier", "layers.9.fc1", "gradient", (777,), 100),
    ("first_nonfinite", "layers.15.fc2", "gradient", (640,), 190),
    ("straggler", None, None, (333,), 1),
    ("rank_stopped", None, None, (1000,), 150),
}
got = {(f["check"], f["module"], f["role"], tuple(f["ranks"]), f["step"]) for f in j["findings"]}
print(f"== findings: {len(got)}; planted and named: {len(expected & got)} of {len(expected)}; "
      f"missed: {sorted(expected - got, key=str) or 'none'}; not planted: {sorted(got - expected, key=str) or 'none'}")
PY

if python3 -c "import duckdb" 2>/dev/null; then
  echo "== the same data in DuckDB"
  python3 - "$RUN" <<'PY'
import duckdb, resource, sys, time
run = sys.argv[1]
con = duckdb.connect()
def timed(label, q):
    t = time.time()
    rows = con.sql(q).fetchall()
    print(f"-- {label}: {time.time() - t:.1f} s, {len(rows)} row(s); first: {rows[:1]}")
# Hive partitioning: `rank` comes from the folder name (the string '00003'), replacing the file's column.
timed("rows per rank, hive_partitioning = true",
      f"SELECT CAST(rank AS INTEGER) AS rank, count(*) FROM read_parquet('{run}/stats/*/*.parquet', hive_partitioning = true) GROUP BY ALL ORDER BY 1")
timed("the slowest ranks' median step time",
      f"SELECT rank, median(step_ms) AS median_ms, quantile_cont(step_ms, 0.9) AS p90_ms FROM read_parquet('{run}/steps/*/*.parquet', hive_partitioning = false) GROUP BY rank ORDER BY median_ms DESC LIMIT 3")
timed("scales that differ within a tp instance (instances from run.json)", f"""
WITH grp AS (SELECT unnest(parallel.groups) AS g FROM read_json('{run}/run.json')),
inst AS (SELECT i AS instance, unnest(g.members[i]) AS rank FROM grp, range(1, len(g.members) + 1) AS t(i) WHERE g.kind = 'tp')
SELECT c.step, c.module, c.role, inst.instance, min(c.scale) AS lo, max(c.scale) AS hi, list(c.rank ORDER BY c.rank) AS ranks
FROM read_parquet('{run}/casts/*/*.parquet', hive_partitioning = false) AS c JOIN inst USING (rank)
GROUP BY ALL HAVING min(c.scale) <> max(c.scale) ORDER BY c.step""")
print(f"-- DuckDB peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
PY
fi
