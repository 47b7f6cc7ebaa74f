#!/usr/bin/env python3
"""What the GPU drew and how fast it clocked while a run trained, from an nvidia-smi log.

  power_summary.py LOG [--step-ms MS] [--held] [--name NAME] [--busy-w 200]

LOG is what `nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,
clocks_throttle_reasons.active --format=csv,noheader -lms 100` wrote while the run went on
(bench/power.sh). The samples drawing more than --busy-w watts are the run's steps (loading,
compiling and the end of the run draw far less). Prints one JSON row: the busy samples' count, the
median SM clock (MHz) and power (W), their range, the share of samples held back by the power cap
(throttle reason bit 0x4, SW power cap, or 0x80, HW power brake), and, given the run's median
step (--step-ms), the energy of a step in joules (median power x step time). With --held (a run
whose GPU was held at each step's start, FP8SCOPE_LEAD_US) the busy samples mix the hold's power
with the steps', so no energy is given. The cap's throttle bit can stay set on a GPU whose power
limit is enforced even below it (seen on an H200 drawing 400 W): the clock is the surer sign.

Exits 1, with one line on stderr, for a missing or unreadable log or one without busy samples.
"""
import json
import statistics
import sys

POWER_CAP_BITS = 0x4 | 0x80


def fail(msg):
    print(f"power_summary.py: {msg}", file=sys.stderr)
    sys.exit(1)


def arg(args, flag, default, conv):
    if flag not in args:
        return default
    i = args.index(flag)
    if i + 1 >= len(args):
        fail(f"{flag} needs a value")
    try:
        return conv(args[i + 1])
    except ValueError:
        fail(f"{flag} {args[i + 1]}: not a number")


def number(field):
    """'1672 MHz' or '692.31 W' -> the number; None for '[N/A]' and the like."""
    try:
        return float(field.split()[0])
    except (ValueError, IndexError):
        return None


def main():
    args = sys.argv[1:]
    if not args or args[0].startswith("--"):
        fail("usage: power_summary.py LOG [--step-ms MS] [--held] [--name NAME] [--busy-w 200]")
    path = args[0]
    step_ms = arg(args, "--step-ms", None, float)
    busy_w = arg(args, "--busy-w", 200.0, float)
    name = arg(args, "--name", path, str)
    try:
        lines = open(path).read().splitlines()
    except OSError as e:
        fail(f"{path}: {e.strerror}")
    samples = []
    for line in lines:
        f = [x.strip() for x in line.split(",")]
        if len(f) < 6:
            continue
        sm, power = number(f[1]), number(f[3])
        try:
            reasons = int(f[5], 16)
        except ValueError:
            reasons = 0
        if sm is not None and power is not None:
            samples.append((sm, power, number(f[4]), reasons))
    busy = [s for s in samples if s[1] > busy_w]
    if not busy:
        fail(f"{path}: no sample draws more than {busy_w:g} W ({len(samples)} readable samples)")
    sm = [s[0] for s in busy]
    pw = [s[1] for s in busy]
    row = {
        "run": name,
        "busy_samples": len(busy),
        "sm_mhz_median": statistics.median(sm),
        "sm_mhz_min": min(sm),
        "sm_mhz_max": max(sm),
        "power_w_median": round(statistics.median(pw), 1),
        "power_w_max": max(pw),
        "power_capped_share": round(sum(1 for s in busy if s[3] & POWER_CAP_BITS) / len(busy), 3),
    }
    temps = [s[2] for s in busy if s[2] is not None]
    if temps:
        row["temperature_c_max"] = max(temps)
    if step_ms is not None:
        row["step_ms"] = step_ms
    if "--held" in args:
        row["held"] = True
    elif step_ms is not None:
        row["joules_per_step"] = round(statistics.median(pw) * step_ms / 1e3, 2)
    print(json.dumps(row))


if __name__ == "__main__":
    main()
