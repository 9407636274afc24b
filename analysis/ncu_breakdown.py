#!/usr/bin/env python3
"""Where a training step's GPU time goes, from ncu's per-kernel durations of one step.

  ncu --metrics gpu__time_duration.sum[,EXTRA] --csv --print-units base fsdpq ... > ncu.csv
  python3 analysis/ncu_breakdown.py ncu.csv [--layers 2] [--top 12]

With the EXTRA metrics (METRICS_FOR_ROOFLINE below) the kernel table also says how close each
kernel runs to a limit: its DRAM traffic rate and the speed-of-light percentages of the SMs and of
memory (ncu's SpeedOfLight figures). A kernel well below both is bound by latency or its own
serialisation, not by the hardware: the first place to look.

(scripts/device_compare.sh PROFILE=label makes the CSV: one step of a 2-layer model of the 7B's
width.) ncu runs the kernels one at a time, so the sums are busy time without overlap: compare
them with the step's time to see what the loaded step adds (clocks, the side stream's contention).

The last step in the file is read: it begins with the batch's id check (find_bad_id_kernel). Its
kernels are split into the forward, the head (from the GEMM before the first cross entropy
through the final norm's backward), the backward and the optimizer (from the gradient norm's
partial sums on), and each kernel into a category by its name (CATEGORIES, first match wins).
With --layers the forward, backward and categories are also given per decoder layer.
"""

import argparse
import collections
import csv
import lzma
import re
import sys

CATEGORIES = (
    ("LoRA", r"lora_|down_reduce|weight_grad_reduce|copy_rows16|ScaledBlock|nvjet_\w*_tss_|splitKreduce"),
    ("attention", r"attention_|sdpa|prepare_kernel"),
    ("dequantise", r"nf4_dequantize|hqq_dequantize"),
    ("norms, residuals, RoPE, SwiGLU", r"rmsnorm|residual|ResidualAdd|swiglu|rope|embedding"),
    ("loss", r"cross_entropy"),
    ("optimizer and gradient adds", r"step_kernel|sq_partials|AddScaled|Convert|map_kernel<1, 0>|fill"),
    ("base GEMMs", r"nvjet|gemm|cutlass|sm90_xmma"),
)


# What scripts/device_compare.sh PROFILE asks ncu for besides the duration.
METRICS_FOR_ROOFLINE = ("dram__bytes_read.sum", "dram__bytes_write.sum",
                        "sm__throughput.avg.pct_of_peak_sustained_elapsed",
                        "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed")


def open_text(path):
    return lzma.open(path, "rt") if path.endswith(".xz") else open(path)


def short_name(kernel):
    name = re.sub(r"\(.*", "", kernel).replace("void ", "")
    return name.replace("fsdpq::<unnamed>::", "").replace("fsdpq::cuda::", "")


def launches(path):
    """Every kernel launch in the CSV, in launch order: {"name", "us", and each other metric ncu
    recorded for it, by metric name}. ncu writes one row per (launch, metric)."""
    with open_text(path) as f:
        rows = list(csv.DictReader(line for line in f if line.startswith('"')))
    by_id = {}
    for r in rows:
        launch = by_id.setdefault(r["ID"], {"name": short_name(r["Kernel Name"])})
        value = float(r["Metric Value"].replace(",", ""))
        if r.get("Metric Name") == "gpu__time_duration.sum":
            launch["us"] = value / 1e3
        else:
            launch[r["Metric Name"]] = value
    return [launch for launch in by_id.values() if "us" in launch]


def kernels(path):
    """[(name, µs)] of every kernel in the CSV, in launch order."""
    return [(launch["name"], launch["us"]) for launch in launches(path)]


def roofline_columns(group):
    """For launches of one kernel: its DRAM rate (GB/s over their time) and time-weighted SM and
    memory speed of light (%), or None where ncu did not record them."""
    if not all(m in launch for launch in group for m in METRICS_FOR_ROOFLINE):
        return None
    us = sum(launch["us"] for launch in group)
    dram = sum(launch["dram__bytes_read.sum"] + launch["dram__bytes_write.sum"] for launch in group)

    def weighted(metric):
        return sum(launch[metric] * launch["us"] for launch in group) / us if us else 0.0

    return (dram / (us * 1e-6) / 1e9 if us else 0.0, weighted(METRICS_FOR_ROOFLINE[2]),
            weighted(METRICS_FOR_ROOFLINE[3]))


def category(name):
    for label, pattern in CATEGORIES:
        if re.search(pattern, name):
            return label
    return "other"


def last_step(ks):
    starts = [i for i, (n, _) in enumerate(ks) if "find_bad_id_kernel" in n]
    if not starts:
        raise ValueError("no step in the profile: no find_bad_id_kernel launch")
    return ks[starts[-1]:]


def phases(step):
    """{"forward", "head", "backward", "optimizer"} → [(name, µs)], or the whole step as "step"."""
    names = [n for n, _ in step]
    loss = [i for i, n in enumerate(names) if "cross_entropy" in n]
    norm_back = [i for i, n in enumerate(names) if "rmsnorm_dx" in n]
    optimizer = [i for i, n in enumerate(names) if "sq_partials" in n or "step_kernel" in n]
    if not (loss and norm_back and optimizer):
        return {"step": step}
    head0, head1, opt0 = loss[0] - 1, norm_back[0], optimizer[0]
    return {"forward": step[:head0], "head": step[head0:head1 + 1], "backward": step[head1 + 1:opt0],
            "optimizer": step[opt0:]}


def report(step, layers=0, top=12, step_launches=None):
    lines = [f"kernels in the step: {len(step)}, busy {sum(us for _, us in step) / 1e3:.2f} ms", ""]
    per = f" | µs per layer (÷ {layers})" if layers else ""
    lines += [f"| phase | kernels | µs{per} |", "|---|---|---|" + ("---|" if layers else "")]
    for name, part in phases(step).items():
        us = sum(u for _, u in part)
        layer = f" | {us / layers:,.0f}" if layers and name in ("forward", "backward") else (" | " if layers else "")
        lines.append(f"| {name} | {len(part)} | {us:,.0f}{layer} |")
    # Per layer: the forward's and backward's kernels only (the head and the optimizer are per step).
    parts = phases(step)
    in_layers = parts.get("forward", []) + parts.get("backward", [])
    totals, layer_totals = collections.defaultdict(float), collections.defaultdict(float)
    for name, us in step:
        totals[category(name)] += us
    for name, us in in_layers:
        layer_totals[category(name)] += us
    per_layer = f" | µs per layer (forward + backward ÷ {layers})" if layers and in_layers else ""
    lines += ["", f"| category | µs{per_layer} |", "|---|---|" + ("---|" if per_layer else "")]
    for label, us in sorted(totals.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {label} | {us:,.0f}" + (f" | {layer_totals[label] / layers:,.0f}" if per_layer else "") + " |")
    return "\n".join(lines + kernel_table(step, top, step_launches))


def kernel_table(step, top, step_launches):
    """The `top` kernels by time: launches, µs, and the roofline columns where recorded."""
    lines = []
    by_kernel = collections.defaultdict(lambda: [0, 0.0])
    for name, us in step:
        by_kernel[name[:80]][0] += 1
        by_kernel[name[:80]][1] += us
    groups = collections.defaultdict(list)
    for launch in step_launches or []:
        groups[launch["name"][:80]].append(launch)
    roofline = {name: roofline_columns(group) for name, group in groups.items()}
    with_roofline = any(v is not None for v in roofline.values())
    if with_roofline:
        lines += ["", "| kernel | launches | µs | DRAM GB/s | SM % of peak | memory % of peak |", "|---|---|---|---|---|---|"]
    else:
        lines += ["", "| kernel | launches | µs |", "|---|---|---|"]
    for name, (count, us) in sorted(by_kernel.items(), key=lambda kv: -kv[1][1])[:top]:
        row = f"| {name} | {count} | {us:,.0f} |"
        if with_roofline:
            r = roofline.get(name)
            row += " | | |" if r is None else f" {r[0]:,.0f} | {r[1]:.0f} | {r[2]:.0f} |"
        lines.append(row)
    return lines


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("csv", help="ncu's --csv output (or .xz of it)")
    p.add_argument("--layers", type=int, default=0, help="decoder layers of the profiled model: per-layer columns")
    p.add_argument("--top", type=int, default=12, help="kernels listed by their time")
    a = p.parse_args(argv)
    try:
        all_launches = launches(a.csv)
        step = last_step([(launch["name"], launch["us"]) for launch in all_launches])
        print(report(step, a.layers, a.top, all_launches[len(all_launches) - len(step):]))
    except (OSError, ValueError, KeyError) as e:
        print(f"ncu_breakdown.py: {a.csv}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
