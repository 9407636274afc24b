#!/usr/bin/env python3
"""Where a CPU-offload step's time goes, from a profile trace (fsdpq ... --profile true).

  python3 analysis/offload_trace.py runs/x/trace.rank0.json [--skip 1]

Per step after the first --skip: the step's length; on the main thread the gradient norm's wait
for the worker ("norm wait") and the forward's waits for queued updates ("update wait", also the
first unit's alone); on the worker thread its busy time split into copy-out waits, accumulation
and updates. With clipping, the forward waiting at its first unit points at the serial tail (the
last unit's copy-out, the norm, the first update); waits spread over every unit at a worker too
slow for the forward it overlaps.
"""

import argparse
import json
import sys

WORKER = ("host copy-out wait", "host accumulate", "host update")
MAIN = ("norm wait", "update wait")


def spans(path):
    with open(path) as f:
        events = json.load(f)
    return [e for e in events if e.get("ph") == "X"]


def summarize(events, skip=1):
    """One dict per step (ms): step, norm wait, update wait, first update wait, and the worker's parts."""
    steps = sorted((e for e in events if e["name"].startswith("step ")), key=lambda e: e["ts"])
    rows = []
    for step in steps[skip:]:
        begin, end = step["ts"], step["ts"] + step["dur"]
        inside = [e for e in events if begin <= e["ts"] < end]
        row = {"step": step["name"], "step_ms": step["dur"] / 1e3}
        for what in WORKER + MAIN:
            row[what] = sum(e["dur"] for e in inside if e["name"].startswith(what + " (")) / 1e3
        waits = sorted((e for e in inside if e["name"].startswith("update wait (")), key=lambda e: e["ts"])
        row["first update wait"] = waits[0]["dur"] / 1e3 if waits else 0.0
        row["units waited for"] = sum(1 for e in waits if e["dur"] > 50)  # over 50 µs
        rows.append(row)
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace")
    p.add_argument("--skip", type=int, default=1, help="steps to leave out at the start (warm-up)")
    a = p.parse_args(argv)
    try:
        rows = summarize(spans(a.trace), a.skip)
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"{a.trace}: not a readable fsdpq trace: {e}")
    if not rows:
        sys.exit(f"{a.trace}: no step after the first {a.skip}")
    cols = ["step_ms", "norm wait", "update wait", "first update wait", "units waited for", *WORKER]
    print("| step | " + " | ".join(c.replace("_ms", "") + (" (ms)" if c != "units waited for" else "") for c in cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for r in rows:
        print(f"| {r['step']} | " + " | ".join(f"{r[c]:.1f}" if c != "units waited for" else str(r[c]) for c in cols) + " |")


if __name__ == "__main__":
    main()
