#!/usr/bin/env python3
"""Where a kernel's instructions and stalls go, from Nsight Compute's per-instruction SASS page
(`ncu -i REPORT --page source --csv --print-source sass > kernel.sass.csv`, which
scripts/device_ncu.sh writes with SASS=1): instructions executed and stall samples by opcode, the
stall reasons, and with --per N the instructions a unit of work (e.g. elements × adapters / 32 for
a warp-level count per element and adapter). Plain Python, no GPU.
  usage: analysis/ncu_instruction_mix.py kernel.sass.csv[.xz] [--per N] [--top K]"""
import argparse
import collections
import csv
import io
import lzma
import re


def rows_of(path):
    text = lzma.open(path, "rt").read() if path.endswith(".xz") else open(path).read()
    rows = list(csv.reader(io.StringIO(text)))
    header_at = next(i for i, r in enumerate(rows) if "Source" in r and "Instructions Executed" in r)
    return rows[header_at], [r for r in rows[header_at + 1:] if len(r) == len(rows[header_at])]


def mix(path):
    """Instructions executed and stall samples by opcode (predicates and modifiers dropped), and the
    stall samples by reason."""
    head, body = rows_of(path)
    col = {h: i for i, h in enumerate(head)}
    stall_cols = [h for h in head if h.startswith("stall_") and "Not Issued" not in h]
    executed, samples, stalls = collections.Counter(), collections.Counter(), collections.Counter()
    for r in body:
        source = re.sub(r"^@!?U?P\w+\s+", "", r[col["Source"]].strip())
        opcode = source.split(" ")[0].split(".")[0]
        executed[opcode] += int(r[col["Instructions Executed"]] or 0)
        samples[opcode] += int(r[col["Warp Stall Sampling (All Samples)"]] or 0)
        for c in stall_cols:
            stalls[c[len("stall_"):]] += int(r[col[c]] or 0)
    return executed, samples, stalls


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--per", type=float, default=0, help="divide instruction counts by this many units of work")
    ap.add_argument("--top", type=int, default=20)
    a = ap.parse_args()
    executed, samples, stalls = mix(a.csv)
    total, sampled = sum(executed.values()), max(1, sum(samples.values()))
    print(f"warp instructions executed {total:,}" + (f", {total / a.per:.2f} a unit" if a.per else "")
          + f"; stall samples {sampled:,}")
    for opcode, n in executed.most_common(a.top):
        per = f"  {n / a.per:6.2f} a unit" if a.per else ""
        print(f"  {opcode:10s} {n:>12,} {100 * n / total:5.1f}%{per}   samples {100 * samples[opcode] / sampled:5.1f}%")
    print("stall reasons, share of samples:")
    for reason, n in stalls.most_common(10):
        print(f"  {reason:20s} {100 * n / sampled:5.1f}%")


if __name__ == "__main__":
    main()
