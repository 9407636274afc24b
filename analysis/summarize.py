#!/usr/bin/env python3
"""Markdown tables (and PNG plots) of fsdpq runs, in the shape of fsdp_qlora's benchmarks_03_2024 report.

  python3 analysis/summarize.py runs/7b_2gpu [more run dirs or metrics.jsonl files] [--plots DIR]

Reads every metrics.jsonl at or below the paths (and each sweep's sweep.jsonl, for the points that
failed). Per run: the settings that differ between the runs, tokens/s, seconds per 1,024 samples,
MFU, peak allocated/reserved memory and where the step time went, over the steps after the first
--warmup of each process (default 1). A file that cannot be read is named, with its line, in one
line on stderr and that run is left out; the exit code is 1 only when no run could be read.
"""

import argparse
import math
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "bench"))
from runs import RunError, find_manifests, find_metrics, read_manifest, read_run  # noqa: E402
from shapes import FLOP_CONVENTION, LORA_TARGETS, flops_per_token  # noqa: E402  (one FLOP count for bench/ and analysis/)

GIB = 2.0 ** 30
# Dense bf16 tensor-core peaks with fp32 accumulation (datasheets), matched in this order against
# the device name the header records; anything else (the CPU too) has no MFU unless --peak-tflops.
PEAK_TFLOPS = (("H100 PCIe", 756.0), ("H100", 989.0), ("H200", 989.0), ("GH200", 989.0), ("H800", 989.0),
               ("A100", 312.0), ("A800", 312.0), ("L40S", 362.0), ("RTX 4090", 165.2), ("RTX 3090", 71.0),
               ("RTX A6000", 154.8))
SHAPE_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "vocab_size")
LORA_TYPES = ("lora", "qlora", "custom_lora", "custom_qlora", "hqq_lora", "bnb_dora", "hqq_dora")
LLAMA_PRO_TYPES = ("bnb_llama_pro", "hqq_llama_pro")
TRAIN_TYPE_NAMES = {"lora": "LoRA", "qlora": "QLoRA", "custom_lora": "LoRA", "custom_qlora": "QLoRA", "full": "Full",
                    "hqq_lora": "HQQ-LoRA", "bnb_dora": "QDoRA", "hqq_dora": "HQQ-DoRA", "bnb_llama_pro": "Llama-Pro",
                    "hqq_llama_pro": "Llama-Pro (HQQ)"}

# (column, config key or None): the settings a run is described by, in the report's order.
SETTINGS = ("Model", "GPU", "GPUs", "Nodes", "Train Type", "Precision", "Sharding", "CPU Offload",
            "Act. Offload", "Checkpointing", "Batch Size", "Grad. Accum.", "Context Length", "LoRA r")


def peak_tflops_of(device):
    for needle, tflops in PEAK_TFLOPS:
        if needle.lower() in device.lower():
            return tflops
    return None


def lora_targets(config):
    value = config.get("lora_target_modules", "all")
    if value == "all":
        return LORA_TARGETS
    if value == "default":
        return ("q_proj", "v_proj")
    return tuple(t.strip() for t in value.split(",") if t.strip())


def run_flops_per_token(header, seq_len):
    """FLOPs per trained token under bench/shapes.py's convention (stated in its docstring)."""
    model, config = header["model"], header["config"]
    shape = {k: model[k] for k in SHAPE_KEYS}
    if config.get("train_type", "qlora") in LORA_TYPES:
        return flops_per_token(shape, seq_len, int(config.get("lora_rank", 64)), lora_targets(config))
    if config.get("train_type") in LLAMA_PRO_TYPES:
        # The header's model is the expanded one; only the new blocks train.
        return flops_per_token(shape, seq_len, 0, (), int(config.get("llama_pro_num_new_blocks", 0)))
    # Full fine-tuning: every weight also gets its weight gradient, 6 instead of 4 FLOPs per weight.
    frozen = flops_per_token(shape, 0, 0, ())
    attention = flops_per_token(shape, seq_len, 0, ()) - frozen
    return 1.5 * frozen + attention


def flag(value):
    return {"true": "True", "false": "False"}.get(str(value), str(value))


def settings_of(header):
    c = header["config"]
    device = header.get("device", "?")
    train_type = c.get("train_type", "?")
    return {
        "Model": str(header["model"].get("name", c.get("model_name", "?"))).rstrip("/").split("/")[-1],
        "GPU": "CPU" if device == "cpu" else device.replace("NVIDIA ", ""),
        "GPUs": header.get("world_size", "?"),
        "Nodes": header.get("nodes", 1),
        "Train Type": TRAIN_TYPE_NAMES.get(train_type, train_type),
        "Precision": c.get("precision", "?"),
        "Sharding": header.get("sharding_strategy", c.get("sharding_strategy", "?")),
        "CPU Offload": flag(c.get("use_cpu_offload", "?")),
        "Act. Offload": flag(c.get("use_activation_cpu_offload", "?")),
        "Checkpointing": flag(c.get("use_gradient_checkpointing", "?")),
        "Batch Size": int(c["batch_size"]) if str(c.get("batch_size", "")).isdigit() else c.get("batch_size", "?"),
        "Grad. Accum.": c.get("gradient_accumulation_steps", "1"),
        "Context Length": int(c["context_length"]) if str(c.get("context_length", "")).isdigit() else "?",
        "LoRA r": c.get("lora_rank", "?") if train_type in LORA_TYPES else "—",
    }


def phase(record, name, legacy):
    """A step phase in seconds: phase_seconds[name], else the older top-level field, else None."""
    phases = record.get("phase_seconds")
    if isinstance(phases, dict) and isinstance(phases.get(name), (int, float)):
        return float(phases[name])
    if legacy and isinstance(record.get(legacy), (int, float)):
        return float(record[legacy])
    return None


def memory_value(run, at, key):
    for m in run.memory:
        if m.get("at") == at and isinstance(m.get(key), (int, float)):
            return float(m[key])
    return None


def peak(run, summary_key, memory_key):
    """The summary's largest-rank peak, else the largest rank-0 checkpoint value, else None."""
    if run.summary and isinstance(run.summary.get(summary_key), (int, float)):
        return float(run.summary[summary_key])
    values = [float(m[memory_key]) for m in run.memory if isinstance(m.get(memory_key), (int, float))]
    return max(values) if values else None


def analyse(run, name, warmup, peak_override):
    """One row of numbers for a run; RunError when no step is left after the warm-up."""
    per_segment = {}
    timed = []
    for segment, record in run.steps:
        per_segment[segment] = per_segment.get(segment, 0) + 1
        if per_segment[segment] > warmup:  # each process start warms up again (a resumed run too)
            timed.append(record)
    if not timed:
        raise RunError(run.path, None, f"{len(run.steps)} step record(s), none after the {warmup} warm-up step(s) "
                                       "(--warmup)")
    header = run.header
    for key in SHAPE_KEYS:
        if not isinstance(header["model"].get(key), int) or header["model"][key] <= 0:
            raise RunError(run.path, 1, f"the header's model has no positive integer '{key}'")
    seconds = sum(r["step_seconds"] for r in timed)
    tokens = sum(r["tokens"] for r in timed)
    # Padding is not work: the examples' own tokens (records before packing existed: all tokens).
    real_tokens = sum(r.get("real_tokens", r["tokens"]) for r in timed)
    world = int(header.get("world_size", 1) or 1)
    c = header["config"]
    per_step_samples = int(c.get("batch_size", 1)) * int(c.get("gradient_accumulation_steps", 1)) * world
    # Packed runs' "samples" are rows; "examples" (newer records) counts what a sample means.
    samples = sum(float(r.get("examples", r.get("samples", per_step_samples))) for r in timed)
    tps = tokens / seconds
    seq_len = tokens / samples if samples else float(c.get("context_length", 0))
    flops = run_flops_per_token(header, seq_len)
    device = header.get("device", "cpu")
    peak_tf = peak_override or (peak_tflops_of(device) if device != "cpu" else None)
    row = dict(settings_of(header))
    row.update({
        "Run": name, "path": run.path, "steps": len(timed), "tokens_per_second": tps,
        "real_tokens_per_second": real_tokens / seconds,
        "seconds_per_1024_samples": seconds / samples * 1024 if samples else None,
        "flops_per_token": flops, "peak_tflops": peak_tf,
        # Tokens are summed over ranks; MFU is per GPU.
        "mfu": tps / world * flops / (peak_tf * 1e12) if peak_tf else None,
        "peak_allocated_bytes": peak(run, "peak_device_allocated_bytes", "peak_allocated_bytes"),
        "peak_reserved_bytes": peak(run, "peak_device_reserved_bytes", "peak_reserved_bytes"),
        "allocated_after_load_bytes": memory_value(run, "after_load", "allocated_bytes"),
        "reserved_after_load_bytes": memory_value(run, "after_load", "reserved_bytes"),
        "peak_allocated_first_fb_bytes": memory_value(run, "after_first_forward_backward", "peak_allocated_bytes"),
        "peak_host_bytes": (float(run.summary["peak_host_memory_bytes"])
                            if run.summary and isinstance(run.summary.get("peak_host_memory_bytes"), (int, float))
                            else peak(run, "-", "host_peak_resident_bytes")),
        "complete": run.complete, "resumed": len(run.headers) > 1, "preempted": bool(run.preempted),
    })
    # FSDPQ_SECTION_TIMES=1 runs: the compute stream's seconds per section of the pass (docs/cuda.md).
    sections = run.summary.get("section_seconds") if run.summary else None
    row["sections"] = ({k: float(v) for k, v in sections.items() if isinstance(v, (int, float))}
                       if isinstance(sections, dict) else None)
    # Mean seconds per step of each phase, over the steps that record it.
    for column, key, legacy in (("gather", "gather_wait", "gather_wait_seconds"), ("reduce", "reduce", "reduce_seconds"),
                                ("optimizer", "optimizer", None), ("offload", "offload_copies", None),
                                ("forward_backward", "forward_backward", None)):
        values = [phase(r, key, legacy) for r in timed]
        values = [v for v in values if v is not None]
        row[column + "_s"] = sum(values) / len(values) if values else None
    row["step_s"] = seconds / len(timed)
    # The offload copies happen inside reduce and optimizer (docs/metrics.md): not subtracted again.
    row["compute_s"] = row["step_s"] - sum(row[k + "_s"] or 0.0 for k in ("gather", "reduce", "optimizer"))
    return row


# ---- formatting ----

def fmt(value, spec, scale=1.0):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return format(value * scale, spec)


def fmt_mfu(value):
    if value is None:
        return "—"
    return f"{value:.1%}" if value >= 0.001 else f"{value * 100:.2g}%"  # tiny models: still not 0.0%


def markdown_table(columns, rows):
    """A Markdown table with centred columns, as the report's."""
    out = ["| " + " | ".join(columns) + " |", "| " + " | ".join(":" + "-" * max(3, len(c) - 2) + ":" for c in columns) + " |"]
    for row in rows:
        out.append("| " + " | ".join(str(v) for v in row) + " |")
    return "\n".join(out)


def differing(rows):
    """(settings that differ between the runs, those that are the same for all)."""
    if len(rows) == 1:
        return [], list(SETTINGS)
    vary = [s for s in SETTINGS if len({str(r[s]) for r in rows}) > 1]
    return vary, [s for s in SETTINGS if s not in vary]


def caption(rows, same, warmup):
    first = rows[0]
    parts = [f"{s} {first[s]}" for s in same if str(first[s]) not in ("—", "?")]
    return f"*{', '.join(parts)}; {warmup} warm-up step(s) per process left out*"


def note(row, failures):
    notes = []
    if not row["complete"]:
        notes.append("incomplete")
    if row["resumed"]:
        notes.append("resumed")
    status = failures.get(os.path.normpath(os.path.dirname(row["path"])))
    if status:
        notes.append(status["status"])
    return ", ".join(notes)


def report(rows, failures, failed_points, warmup):
    vary, same = differing(rows)
    lead = ["Run"] + vary
    gpu = "GPUs" if any(r["GPU"] != "CPU" for r in rows) else "Ranks"
    heads = [gpu if c == "GPUs" else c for c in lead]
    notes = [note(r, failures) for r in rows]
    with_notes = any(notes)
    out = ["## Throughput", ""]
    # Without any device memory (CPU runs) the memory column is the host's, and says so.
    device_memory = any(r["peak_reserved_bytes"] is not None for r in rows)
    memory_key, memory_head = (("peak_reserved_bytes", "Peak Memory (GiB)") if device_memory
                               else ("peak_host_bytes", "Peak Host Memory (GiB)"))
    cols = heads + [memory_head, "Time (s) / 1,024 samples", "Tokens/s", "MFU", "Timed steps"]
    cols += ["Note"] if with_notes else []
    body = []
    for r, n in zip(rows, notes):
        line = [r[c] for c in lead] + [fmt(r[memory_key], ".2f", 1 / GIB),
                                      fmt(r["seconds_per_1024_samples"], ",.1f"), fmt(r["real_tokens_per_second"], ",.0f"),
                                      fmt_mfu(r["mfu"]), r["steps"]]
        body.append(line + ([n] if with_notes else []))
    out += [markdown_table(cols, body), "", caption(rows, same, warmup), "",
            ("Peak Memory: the largest rank's peak reserved device memory (torch.cuda.max_memory_reserved's "
             "counterpart)." if device_memory else "Peak Host Memory: the largest rank's peak resident set (no "
             "device memory recorded).") + " Time: seconds per 1,024 samples over the timed steps. Tokens/s: the examples' own tokens "
            "(padding is not work; packed runs record them as real_tokens), all ranks together. "
            f"MFU: per GPU, FLOPs per token = {FLOP_CONVENTION} (bench/shapes.py), at the mean trained sequence "
            "length; peak from the GPU's datasheet (dense bf16) or --peak-tflops.", ""]

    out += ["## Memory", ""]
    cols = heads + ["Peak allocated (GiB)", "Peak reserved (GiB)", "Allocated after load (GiB)",
                    "Reserved after load (GiB)", "Peak allocated, 1st fwd+bwd (GiB)", "Peak host RSS (GiB)"]
    body = [[r[c] for c in lead] + [fmt(r[k], ".2f", 1 / GIB) for k in
                                    ("peak_allocated_bytes", "peak_reserved_bytes", "allocated_after_load_bytes",
                                     "reserved_after_load_bytes", "peak_allocated_first_fb_bytes", "peak_host_bytes")]
            for r in rows]
    out += [markdown_table(cols, body), "",
            "Device columns: rank 0's caching allocator at fsdp_qlora's checkpoints, peaks the largest rank's "
            "(— on the CPU backend). Peak host RSS: the largest rank's.", ""]

    out += ["## Step time", ""]
    cols = heads + ["Step (ms)", "Compute", "Gather wait", "Reduce", "Offload copies", "Optimizer"]
    body = []
    for r in rows:
        step = r["step_s"]
        cells = [fmt(step, ",.1f", 1e3)]
        for k in ("compute", "gather", "reduce", "offload", "optimizer"):
            v = r[k + "_s"]
            cells.append("—" if v is None else f"{v * 1e3:,.1f} ({v / step:.0%})")
        body.append([r[c] for c in lead] + cells)
    out += [markdown_table(cols, body), "",
            "Mean ms per timed step (share of the step). Compute = step − gather wait − reduce − optimizer "
            "(what is left: the forward and backward math, data preparation); offload copies are the host⇄GPU "
            "copies inside reduce and optimizer, shown on their own; a phase is — when the metrics do not record "
            "it. Rank 0's times.", ""]

    timed_rows = [r for r in rows if r.get("sections")]
    if timed_rows:
        out += ["## Where the GPU's time goes", ""]
        totals = {}
        for r in timed_rows:
            for k, v in r["sections"].items():
                totals[k] = totals.get(k, 0.0) + v
        names = sorted(totals, key=lambda k: -totals[k])
        cols = heads + names + ["Sections (s)"]
        body = []
        for r in timed_rows:
            total = sum(r["sections"].values())
            cells = [f"{100 * r['sections'][k] / total:.1f}%" if k in r["sections"] and total > 0 else "—"
                     for k in names]
            body.append([r[c] for c in lead] + cells + [fmt(total, ",.2f")])
        out += [markdown_table(cols, body), "",
                "Share of the compute stream's time per section of the pass, from runs made with "
                "FSDPQ_SECTION_TIMES=1 (the summary's section_seconds, over each run's steps after its first; "
                "docs/cuda.md). Rank 0's times; runs without it are left out.", ""]

    if failed_points:
        out += ["## Failed points", ""]
        cols = ["Run", "Settings", "Status", "Exit code", "Message"]
        body = [[p["name"], ", ".join(f"{k}={v}" for k, v in p.get("settings", {}).items()), p.get("status", "?"),
                 p.get("exit_code", "—"), str(p.get("message", "")).replace("|", "\\|")] for p in failed_points]
        out += [markdown_table(cols, body), ""]
    return "\n".join(out)


# ---- plots ----

def plot_all(rows, directory):
    """Writes the PNG plots that the runs have the variation for; returns [(file, None | why not)]."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    df = pd.DataFrame(rows)
    df["peak_reserved_gib"] = df["peak_reserved_bytes"].astype(float) / GIB
    df["peak_host_gib"] = df["peak_host_bytes"].astype(float) / GIB
    df["GPUs"] = pd.to_numeric(df["GPUs"], errors="coerce")
    vary, _ = differing(rows)
    os.makedirs(directory, exist_ok=True)
    gpu = any(r["GPU"] != "CPU" for r in rows)
    # Memory: the device's where runs record it, else the host's (CPU runs).
    specs = (("throughput_vs_batch_size.png", "Batch Size", (("tokens_per_second", "tokens/s (all ranks)"),), False),
             ("memory_vs_context_length.png", "Context Length",
              (("peak_reserved_gib", "peak reserved device memory (GiB)"),
               ("peak_host_gib", "peak host memory, RSS (GiB)")), False),
             ("scaling_vs_gpus.png", "GPUs", (("tokens_per_second", "tokens/s (all ranks)"),), True))
    results = []
    for filename, x, choices, ideal in specs:
        others = [c for c in vary if c not in (x, "Nodes")]
        for y, ylabel in choices:
            data = df[pd.to_numeric(df[x], errors="coerce").notna() & df[y].notna()]
            groups = [(key, g) for key, g in (data.groupby(others, sort=True) if others else [((), data)])
                      if g[x].nunique() >= 2]
            if groups:
                break
        if not groups:
            results.append((filename, f"no runs that differ only in {x}"))
            continue
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for key, g in groups:
            key = key if isinstance(key, tuple) else (key,)
            means = g.groupby(x)[y].mean().sort_index()
            label = ", ".join(f"{c} {v}" for c, v in zip(others, key)) or None
            line, = ax.plot(means.index, means.values, marker="o", label=label)
            if ideal:
                x0, y0 = means.index[0], means.values[0]
                ax.plot(means.index, [y0 * n / x0 for n in means.index], linestyle="--", color=line.get_color(),
                        alpha=0.5, label=f"linear from {x0}" if label is None else None)
        xlabel = ("GPUs" if gpu else "ranks") if x == "GPUs" else x.lower()
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_xticks(sorted(data[x].unique()))
        ax.grid(True, alpha=0.3)
        if any(label for label in ax.get_legend_handles_labels()[1]):
            ax.legend(fontsize=8)
        ax.set_title(f"{ylabel.split(' (')[0]} vs {xlabel}" + (" (dashed: linear scaling)" if ideal else ""))
        fig.tight_layout()
        fig.savefig(os.path.join(directory, filename), dpi=100)
        plt.close(fig)
        results.append((filename, None))
    return results


# ---- main ----

def run_name(path, root):
    directory = os.path.dirname(os.path.abspath(path))
    root = os.path.abspath(root)
    base = root if os.path.isdir(root) else os.path.dirname(root)
    rel = os.path.relpath(directory, base)
    return os.path.basename(directory) if rel == "." else rel


def collect(paths, warmup, peak_override, errors):
    rows, failures, failed_points, names = [], {}, [], set()
    for root in paths:
        for manifest in find_manifests(root):
            try:
                for point, entry in read_manifest(manifest).items():
                    if entry.get("status") not in ("ok", "skipped"):
                        directory = os.path.join(os.path.dirname(manifest), point)
                        entry = dict(entry, name=run_name(os.path.join(directory, "metrics.jsonl"), root))
                        failures[os.path.normpath(directory)] = entry
            except RunError as e:
                errors.append(f"{e}; its failed points are not listed")
        found = find_metrics(root)
        if not found:
            errors.append(f"{root}: no metrics.jsonl at or below it")
        for path in found:
            try:
                run = read_run(path)
                name = run_name(path, root)
                if name in names:
                    name = os.path.dirname(path)
                names.add(name)
                rows.append(analyse(run, name, warmup, peak_override))
            except RunError as e:
                errors.append(f"{e}; run skipped")
            except (KeyError, ValueError, TypeError, ZeroDivisionError) as e:
                # Records that parse but hold values of the wrong kind (a hand-edited or foreign file).
                errors.append(f"{path}: unexpected values ({type(e).__name__}: {e}); run skipped")
    # Natural order (bs2 before bs10), as a sweep lists its points.
    rows.sort(key=lambda r: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", r["Run"])])
    read_dirs = {os.path.normpath(os.path.dirname(r["path"])) for r in rows if r["complete"]}
    for directory, entry in sorted(failures.items()):
        if directory not in read_dirs:
            failed_points.append(entry)
    return rows, failures, failed_points


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="See docs/analysis.md.")
    p.add_argument("paths", nargs="+", help="run directories (searched recursively) or metrics.jsonl files")
    p.add_argument("--warmup", type=int, default=1, help="steps left out at the start of each process (default 1)")
    p.add_argument("--plots", metavar="DIR", help="write the PNG plots into DIR")
    p.add_argument("--peak-tflops", type=float, help="peak FLOP/s per GPU for MFU (default: from the GPU's name)")
    p.add_argument("--csv", metavar="FILE", help="also write one row per run (every number) as CSV")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if args.warmup < 0:
        p.error("--warmup must be 0 or more")
    for path in args.paths:
        if not os.path.exists(path):
            print(f"summarize: error: {path}: no such file or directory", file=sys.stderr)
            return 2

    errors = []
    rows, failures, failed_points = collect(args.paths, args.warmup, args.peak_tflops, errors)
    for e in errors:
        print(f"summarize: {e}", file=sys.stderr)
    if not rows:
        print(f"summarize: error: no run could be read from {', '.join(args.paths)}", file=sys.stderr)
        return 1
    print(report(rows, failures, failed_points, args.warmup))
    if args.csv or args.plots:
        try:
            import matplotlib  # noqa: F401
            import pandas  # noqa: F401
        except Exception as e:  # missing, or broken (a numpy of another ABI shadowing Debian's)
            print(f"summarize: error: --csv and --plots need pandas and matplotlib, which cannot be imported "
                  f"({type(e).__name__}: {e}); on Debian: apt-get install python3-pandas python3-matplotlib",
                  file=sys.stderr)
            return 2
    if args.csv:
        import pandas as pd
        pd.DataFrame(rows).drop(columns=["path"]).to_csv(args.csv, index=False)
    if args.plots:
        for filename, why_not in plot_all(rows, args.plots):
            if why_not:
                print(f"summarize: plot {filename} not written: {why_not}", file=sys.stderr)
            else:
                print(f"summarize: wrote {os.path.join(args.plots, filename)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
