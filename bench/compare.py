#!/usr/bin/env python3
"""Markdown tables from bench.py's results JSONL: every run, then the best batch size of each.

  python3 bench/compare.py RESULTS.jsonl [MORE.jsonl ...]

Peer rows and fsdpq rows (peer names starting "fsdpq") per (shape, ctx, grad ckpt, bs); an fsdpq
row's last column is its tokens/s over the best peer's at the same point. A line that is not a JSON
object (a run killed mid-write) is reported on stderr and skipped; the same point measured twice
keeps the later line.
"""
import json
import sys

KEY = ("model_shape", "context_length", "gradient_checkpointing", "batch_size")
HEADER = ("| shape | ctx | ckpt | r | dropout | bs | peer | tokens/s | MFU | peak alloc GiB | peak reserved GiB "
          "| fsdpq / best peer |\n|---|---|---|---|---|---|---|---|---|---|---|---|")
DEFAULT_DROPOUT = 0.1  # what bench.py ran before its results recorded lora_dropout
DEFAULT_RANK = 64  # and lora_rank


def dropout(r):
    return r.get("lora_dropout", DEFAULT_DROPOUT)


def rank(r):
    return r.get("lora_rank", DEFAULT_RANK)


def lora(r):
    return (rank(r), dropout(r))


def same_point(a, b, keys=KEY):
    """Runs that compare: the same shape, context, checkpointing (and batch), LoRA rank and dropout."""
    return all(a[k] == b[k] for k in keys) and lora(a) == lora(b)


def load(paths, warn):
    rows = {}
    for path in paths:
        try:
            lines = open(path).read().splitlines()
        except OSError as e:
            warn(f"{path}: cannot read ({e.strerror})")
            continue
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except ValueError:
                warn(f"{path}:{n}: skipped, not valid JSON (a run cut off mid-write?): {line[:60]!r}")
                continue
            missing = [k for k in ("peer",) + KEY if not isinstance(r, dict) or k not in r]
            if missing:
                warn(f"{path}:{n}: skipped, no {', '.join(missing)}")
                continue
            rows[(r["peer"],) + tuple(r[k] for k in KEY) + lora(r) + (variant(r),)] = r
    return list(rows.values())


# bench.py --fsdpq-args and --fsdpq-env settings a run had, in words where they are common ones.
SETTING_WORDS = {"--use_activation_cpu_offload true": "act offload", "--use_cpu_offload true": "cpu offload",
                 "FSDPQ_ATTENTION=cudnn-nondeterministic": "non-deterministic attention"}


def variant(r):
    """The extra fsdpq settings of a run (bench.py --fsdpq-args, then its FSDPQ_* environment), as its
    label shows them: each run of another variant at the same point is a row of its own."""
    text = " ".join(f"{r.get('fsdpq_args') or ''} {r.get('fsdpq_env') or ''}".split())
    for flags, words in SETTING_WORDS.items():
        text = text.replace(flags, words)
    return text


def is_fsdpq(r):
    return str(r["peer"]).startswith("fsdpq")


def tps(r):
    v = r.get("tokens_per_second")
    return v if isinstance(v, (int, float)) and not r.get("oom") else None


def outcome(r):
    if r.get("oom"):
        return "OOM"
    if r.get("timeout"):
        return "timeout"
    if tps(r) is None:
        return "error"
    return f"{tps(r):,.0f}"


def num(v, fmt):
    return format(v, fmt) if isinstance(v, (int, float)) else "—"


def ratio_text(r, peers):
    best = max((p for p in peers if tps(p) is not None), key=tps, default=None)
    if not is_fsdpq(r) or tps(r) is None or best is None:
        return "—"
    return f"{tps(r) / tps(best):.2f}× ({best['peer']})"


def peer_text(r):
    """The peer's name, and what an fsdpq run kept (bench.py --fsdpq-memory-of): dense layers, and
    with checkpointing the last layers not recomputed."""
    keep, activations = r.get("keep_dequantized_layers"), r.get("keep_activation_layers")
    kept = [variant(r)] if variant(r) else []
    kept += [f"{keep} kept"] if keep else []
    kept += [f"last {activations} not recomputed"] if activations else []
    return f"{r['peer']} ({', '.join(kept)})" if kept else str(r["peer"])


def line(r, ratio):
    ckpt = "on" if r["gradient_checkpointing"] else "off"
    return (f"| {r['model_shape']} | {r['context_length']} | {ckpt} | {rank(r)} | {dropout(r):g} | {r['batch_size']} "
            f"| {peer_text(r)} "
            f"| {outcome(r)} | {num(r.get('mfu') if tps(r) else None, '.1%')} | {num(r.get('peak_allocated_gib'), '.1f')} "
            f"| {num(r.get('peak_reserved_gib'), '.1f')} | {ratio} |")


def order(r):
    return (str(r["model_shape"]), r["context_length"], not r["gradient_checkpointing"], lora(r), r["batch_size"],
            is_fsdpq(r), r["peer"], variant(r))


def tables(rows):
    out = ["## Every run", "", HEADER]
    for r in sorted(rows, key=order):
        same = [p for p in rows if not is_fsdpq(p) and same_point(p, r)]
        out.append(line(r, ratio_text(r, same)))
    # Each peer (and fsdpq variant) at its own best batch size: fsdpq may fit (and need) a larger
    # batch than the peers.
    best = {}
    for r in rows:
        k = (r["peer"],) + tuple(r[k] for k in KEY[:3]) + lora(r) + (variant(r),)
        if tps(r) is not None and (k not in best or tps(r) > tps(best[k])):
            best[k] = r
    out += ["", "## Best batch size of each", "", HEADER]
    for r in sorted(best.values(), key=order):
        same = [p for p in best.values() if not is_fsdpq(p) and same_point(p, r, KEY[:3])]
        out.append(line(r, ratio_text(r, same)))
    return "\n".join(out)


def main(argv=None):
    paths = (sys.argv[1:] if argv is None else argv) or ["bench/results.jsonl"]
    rows = load(paths, lambda msg: print(f"compare.py: {msg}", file=sys.stderr))
    if not rows:
        print(f"compare.py: no results in {', '.join(paths)}", file=sys.stderr)
        return 1
    print(tables(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
