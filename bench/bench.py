#!/usr/bin/env python3
"""Side-by-side benchmark driver: every (peer, shape, ctx, grad-ckpt) point at bs 1, 2, 4, ... until
out of memory (or --max-bs), each run in its own process with a timeout, one JSON line per run
appended to --results. Peers are entries of PEERS: a name and a function giving the command to run
and the function that turns its outcome into a record; fsdpq's two entries run only with --fsdpq PATH.

On the GPU machine:  python3 bench/bench.py --results $OUT/results.jsonl --log $OUT/bench.log
Then:                python3 bench/compare.py $OUT/results.jsonl
"""
import argparse
import collections
import datetime
import glob
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from shapes import DEFAULT_PEAK_TFLOPS, FLOP_CONVENTION, SHAPES, flops_per_token, mfu, shape_dict

HF_PEERS = ("hf_lora_eager", "hf_lora_compile", "hf_qlora_bnb", "hf_lora_liger")
FSDPQ_PEERS = {"fsdpq_lora": "lora", "fsdpq_qlora": "qlora"}


# A run's LoRA settings, every peer's the same: rank (α stays 16, fsdp_qlora's) and dropout.
Lora = collections.namedtuple("Lora", "rank dropout")


def lora_of(a):
    return Lora(a.lora_rank, a.lora_dropout)


def peer_command(a, peer, shape, ctx, bs, ckpt, workdir):
    cmd = [sys.executable, os.path.join(HERE, "peer_train.py"), "--peer", peer, "--shape", shape,
           "--batch-size", str(bs), "--context-length", str(ctx), "--warmup", str(a.warmup),
           "--steps", str(a.steps), "--device", a.device, "--peak-tflops", str(a.peak_tflops),
           "--lora-r", str(a.lora_rank), "--lora-dropout", str(a.lora_dropout),
           "--grad-ckpt" if ckpt else "--no-grad-ckpt"]
    return cmd + shlex.split(a.peer_args), lambda proc: last_json_line(proc.stdout)


def fsdpq_point(train_type, shape, ctx, bs, ckpt, lora):
    """fsdpq's flags for a point: the peers' shape, batch, context and LoRA settings (a Lora)."""
    return ["--model_name", f"preset:{shape}", "--train_type", train_type, "--dataset", "dummy",
            "--context_length", str(ctx), "--batch_size", str(bs),
            "--use_gradient_checkpointing", "true" if ckpt else "false",
            "--lora_rank", str(lora.rank), "--lora_alpha", "16", "--lora_dropout", str(lora.dropout)]


def fsdpq_command(a, peer, shape, ctx, bs, ckpt, workdir):
    """fsdpq at the point, on fixed-length dummy records."""
    steps = a.warmup + a.steps
    cmd = [a.fsdpq, *fsdpq_point(FSDPQ_PEERS[peer], shape, ctx, bs, ckpt, lora_of(a)),
           "--tokenizer_path", "builtin:bytes", "--dataset_samples", str(bs * steps),
           "--pad_to_context_length", "true", "--max_steps", str(steps), "--lr", "1e-5",
           "--log_to", "stdout", "--output_dir", workdir]
    return cmd + shlex.split(a.fsdpq_args), lambda proc: fsdpq_record(a, workdir, shape, ctx, proc)


def fsdpq_env_settings(words):
    """--fsdpq-env's FSDPQ_NAME=value words as a dict; ValueError naming a word of another form."""
    settings = {}
    for word in shlex.split(words):
        name, sep, value = word.partition("=")
        if not sep or not name.startswith("FSDPQ_"):
            raise ValueError(f"--fsdpq-env wants FSDPQ_NAME=value words, not {word!r}")
        settings[name] = value
    return settings


def fsdpq_environment():
    """The FSDPQ_* settings every fsdpq process of the grid (runs and `fsdpq plan`) inherits, as a
    record names them: the caller's, with --fsdpq-env's on top (main puts those in os.environ)."""
    return " ".join(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("FSDPQ_"))


def fsdpq_record(a, workdir, shape, ctx, proc):
    """tokens/s over the steps after the warm-up, from output_dir/metrics.jsonl's "step" records."""
    rec = {"tokens_per_second": None, "steps_timed": 0, "step_seconds": [], "oom": False}
    if proc.returncode != 0:
        if "out of memory" in (proc.stdout + proc.stderr).lower():
            rec["oom"] = True
        else:
            rec["error"] = f"fsdpq exited {proc.returncode}"
        return rec
    lines = [json.loads(x) for x in open(os.path.join(workdir, "metrics.jsonl")) if x.strip()]
    steps = [r for r in lines if r.get("type") == "step" and r["step"] > a.warmup]
    summary = next((r for r in lines if r.get("type") == "summary"), {})
    seconds = sum(r["step_seconds"] for r in steps)
    flops = flops_per_token(shape_dict(shape), ctx)
    tps = sum(r["tokens"] for r in steps) / seconds if seconds else None
    gib = lambda key: round(summary[key] / 2 ** 30, 3) if summary.get(key) is not None else None  # noqa: E731
    rec.update(tokens_per_second=tps, steps_timed=len(steps), step_seconds=[r["step_seconds"] for r in steps],
               flops_per_token=flops, mfu=mfu(tps, flops, a.peak_tflops) if tps else None,
               peak_tflops=a.peak_tflops, flop_convention=FLOP_CONVENTION,
               # the caching allocator's peaks, which the CUDA backend writes into the summary (docs/metrics.md)
               peak_allocated_gib=gib("peak_device_allocated_bytes"),
               peak_reserved_gib=gib("peak_device_reserved_bytes"))
    return rec


PEERS = {name: peer_command for name in HF_PEERS} | {name: fsdpq_command for name in FSDPQ_PEERS}


def plan_peak_gib(fsdpq, shape, ctx, bs, ckpt, lora, keep, activations=0, extra=()):
    """`fsdpq plan`'s peak allocated GiB for fsdpq_qlora at this point with `keep` kept dense layers
    (and, with checkpointing, the last `activations` layers not recomputed), with the run's extra
    settings (--fsdpq-args: an offload changes what fits)."""
    cmd = [fsdpq, "plan", *fsdpq_point("qlora", shape, ctx, bs, ckpt, lora), *extra,
           "--keep_dequantized_layers", str(keep)]
    if activations:
        cmd += ["--keep_activation_layers", str(activations)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    m = re.search(r"\| \*\*peak allocated\*\* \| ([0-9.]+) \|", out)
    if not m:
        raise ValueError(f"no peak allocated in the output of {shlex.join(cmd)}")
    return float(m.group(1))


PLAN_MARGIN = 0.99  # of the peer's peak, for --fsdpq-memory-of's search (memory_matched_args)


def most_layers_under(peak_with, layers, cap_gib, lowest=0):
    """The largest n in lowest … layers with peak_with(n) at most cap_gib, or None where even lowest is
    over. Peaks grow with n: a binary search."""
    if peak_with(lowest) > cap_gib:
        return None
    lo, hi = lowest, layers  # lo fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if peak_with(mid) <= cap_gib:
            lo = mid
        else:
            hi = mid - 1
    return lo


def kept_layers_under(fsdpq, shape, ctx, bs, ckpt, lora, cap_gib, activations=0, extra=()):
    """The most layers fsdpq_qlora keeps dense (keep_dequantized_layers) with its planned peak at most
    cap_gib, or None where even none fits."""
    return most_layers_under(lambda k: plan_peak_gib(fsdpq, shape, ctx, bs, ckpt, lora, k, activations, extra),
                             shape_dict(shape)["num_hidden_layers"], cap_gib)


def activation_layers_under(fsdpq, shape, ctx, bs, lora, cap_gib, extra=()):
    """With checkpointing: the most last layers fsdpq_qlora leaves unrecomputed (keep_activation_layers)
    with its planned peak at most cap_gib (no dense layers kept), or None where even none fits (one,
    with recompute_elementwise, which trims the layers kept and refuses a run that keeps none)."""
    trims = any(flag == "--recompute_elementwise" and value == "true" for flag, value in zip(extra, extra[1:]))
    return most_layers_under(lambda n: plan_peak_gib(fsdpq, shape, ctx, bs, True, lora, 0, n, extra),
                             shape_dict(shape)["num_hidden_layers"], cap_gib, lowest=1 if trims else 0)


def last_json_line(stdout):
    for line in reversed(stdout.splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return {"error": "the run printed no JSON line"}


def install_wheel(a, module, wheel_prefix, peer):
    """bitsandbytes and liger-kernel are not on the GPU machine: pip-install the carried wheel into a
    private folder."""
    if subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True).returncode == 0:
        return
    wheels = sorted(glob.glob(os.path.join(a.wheels, f"{wheel_prefix}-*.whl")))
    if not wheels:
        sys.exit(f"{peer} needs {module}: no wheel in {a.wheels} (run bench/fetch_peer_wheels.sh here "
                 "and carry .device/wheels), or leave the peer out with --peers")
    target = os.path.join(tempfile.gettempdir(), "bench-site")
    # --target sidesteps both the venv and PEP 668's externally-managed refusal; the env var covers old pips.
    env = dict(os.environ, PIP_BREAK_SYSTEM_PACKAGES="1")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--upgrade",
                    "--target", target, wheels[-1]], check=True, env=env)
    os.environ["PYTHONPATH"] = target + os.pathsep + os.environ.get("PYTHONPATH", "")
    print(f"installed {os.path.basename(wheels[-1])} into {target}", file=sys.stderr)


def key(r):
    """A record's point: records from before bench.py wrote lora_rank ran at 64."""
    return (r.get("peer"), r.get("model_shape"), r.get("context_length"), r.get("batch_size"),
            r.get("gradient_checkpointing"), r.get("lora_dropout", 0.1), r.get("lora_rank", 64))


def grid_peers(peers_arg, fsdpq):
    """The entries a run measures: --peers, and with --fsdpq both fsdpq entries unless --peers
    names one of them (then only those it names)."""
    peers = [x for x in peers_arg.split(",") if x]
    if fsdpq and not any(x in FSDPQ_PEERS for x in peers):
        peers += list(FSDPQ_PEERS)
    return peers


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="ctx 512, bs 1-2, 2+4 steps: does everything run?")
    p.add_argument("--peers", default=",".join(HF_PEERS), help=f"comma list of {', '.join(PEERS)}")
    p.add_argument("--shapes", default="llama2-7b", help=f"comma list of {', '.join(SHAPES)}")
    p.add_argument("--ctx", default="512,2048")
    p.add_argument("--grad-ckpt", choices=("on", "off", "both"), default="on")
    p.add_argument("--max-bs", type=int, default=64)
    p.add_argument("--bs", default="", help="comma list of batch sizes to run instead of 1, 2, 4 ... --max-bs")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--device", default="cuda")
    p.add_argument("--peak-tflops", type=float, default=DEFAULT_PEAK_TFLOPS)
    p.add_argument("--timeout", type=float, default=600, help="seconds per run")
    p.add_argument("--budget", type=float, default=0, help="seconds for the whole grid (0: no limit); "
                   "no run starts after it and each run's timeout shrinks to what is left")
    p.add_argument("--results", default="bench/results.jsonl")
    p.add_argument("--log", default="bench/bench.log", help="every run's stderr, one after another")
    p.add_argument("--resume", action="store_true", help="skip points already in --results (OOM included)")
    p.add_argument("--wheels", default=".device/wheels")
    p.add_argument("--lora-dropout", type=float, default=0.1, help="every peer's LoRA dropout (fsdp_qlora's 0.1)")
    p.add_argument("--lora-rank", type=int, default=64, help="every peer's LoRA rank (fsdp_qlora's 64; α stays 16)")
    p.add_argument("--peer-args", default="", help="extra flags for peer_train.py")
    p.add_argument("--fsdpq", help="the fsdpq binary: adds the fsdpq_lora and fsdpq_qlora entries (only those of "
                                   "them --peers names, if it names any)")
    p.add_argument("--fsdpq-args", default="", help="extra flags for fsdpq (e.g. a device setting)")
    p.add_argument("--fsdpq-env", default="", metavar="VAR=VALUE ...",
                   help="environment settings for fsdpq's runs and plans, e.g. FSDPQ_ATTENTION=cudnn-nondeterministic "
                        "(its faster, opt-in attention backward); recorded with every FSDPQ_* variable they inherit")
    p.add_argument("--fsdpq-memory-of", default="", metavar="PEER",
                   help="fsdpq_qlora keeps as many layers' dequantised weights (keep_dequantized_layers) as "
                        "`fsdpq plan` says fit under PEER's measured peak allocated memory at the same point "
                        "(PEER runs in the same grid, before fsdpq), with checkpointing after leaving as many of "
                        "the last layers unrecomputed as fit (keep_activation_layers); recorded as those keys")
    a = p.parse_args(argv)
    if a.quick:
        a.ctx, a.max_bs, a.warmup, a.steps = "512", min(a.max_bs, 2), 2, 4
    try:  # (checked before any run; the HF peers ignore FSDPQ_* variables)
        os.environ.update(fsdpq_env_settings(a.fsdpq_env))
    except ValueError as e:
        p.error(str(e))
    peers = grid_peers(a.peers, a.fsdpq)
    unknown = [x for x in peers if x not in PEERS] + [s for s in a.shapes.split(",") if s not in SHAPES]
    if unknown:
        p.error(f"unknown peer or shape: {', '.join(unknown)}")
    if any(x in FSDPQ_PEERS for x in peers) and not a.fsdpq:
        p.error("the fsdpq entries need --fsdpq PATH")
    if a.fsdpq_memory_of and (a.fsdpq_memory_of not in HF_PEERS or a.fsdpq_memory_of not in peers):
        p.error(f"--fsdpq-memory-of {a.fsdpq_memory_of}: expected one of the HF peers this grid runs "
                f"({', '.join(x for x in peers if x in HF_PEERS) or 'none'})")
    if "hf_qlora_bnb" in peers:
        install_wheel(a, "bitsandbytes", "bitsandbytes", "hf_qlora_bnb")
    if "hf_lora_liger" in peers or "--liger" in a.peer_args:
        install_wheel(a, "liger_kernel", "liger_kernel", "hf_lora_liger")

    done = {}
    if a.resume and os.path.exists(a.results):
        for line in open(a.results):
            try:
                r = json.loads(line)
                done[key(r)] = r
            except ValueError:
                pass  # a line cut short by a killed run: that point runs again
    ckpts = {"on": [True], "off": [False], "both": [True, False]}[a.grad_ckpt]
    start = time.time()
    os.makedirs(os.path.dirname(os.path.abspath(a.results)), exist_ok=True)
    with open(a.results, "a") as results, open(a.log, "a") as logf:
        for shape in a.shapes.split(","):
            for ctx in [int(c) for c in a.ctx.split(",")]:
                for ckpt in ckpts:
                    for peer in peers:
                        sizes = [int(b) for b in a.bs.split(",")] if a.bs else \
                            [1 << i for i in range(a.max_bs.bit_length()) if 1 << i <= a.max_bs]
                        for bs in sizes:
                            k = (peer, shape, ctx, bs, ckpt, a.lora_dropout, a.lora_rank)
                            extra = []
                            if peer == "fsdpq_qlora" and a.fsdpq_memory_of and k not in done:
                                # where the peer did not run or fit there is no memory to match: none kept
                                extra = memory_matched_args(a, done, shape, ctx, bs, ckpt) or []
                            rec = done.get(k) or run_one(a, peer, shape, ctx, bs, ckpt, start, results, logf, extra)
                            done[k] = rec
                            if rec is None or rec.get("oom") or rec.get("error") or rec.get("timeout"):
                                break  # a larger batch would fail the same way
    print(f"results in {a.results}; table: python3 bench/compare.py {a.results}", file=sys.stderr)


def memory_matched_args(a, done, shape, ctx, bs, ckpt):
    """fsdpq_qlora's flags at --fsdpq-memory-of's measured peak here, or None: with checkpointing first
    as many of the last layers not recomputed as fit (each saves a layer's forward), then as many
    layers kept dense as the rest allows (each saves a layer's dequantisation); without, the latter."""
    peer = done.get((a.fsdpq_memory_of, shape, ctx, bs, ckpt, a.lora_dropout, a.lora_rank)) or {}
    cap = peer.get("peak_allocated_gib")
    if not cap:
        return None
    # The plan's peaks land within ~0.5% of the measured ones, on either side (stop 41: 25.79 GiB
    # measured at ctx 512, bs 4, 27 kept, against the peer's 25.74 that the plan had kept under):
    # a margin keeps the measured peak at or below the peer's, which #24 asks of every point.
    extra = shlex.split(a.fsdpq_args)  # the run's own settings, planned with it
    activations = (activation_layers_under(a.fsdpq, shape, ctx, bs, lora_of(a), cap * PLAN_MARGIN, extra)
                   if ckpt else 0)
    if activations is None:
        return None
    keep = kept_layers_under(a.fsdpq, shape, ctx, bs, ckpt, lora_of(a), cap * PLAN_MARGIN, activations, extra)
    if keep is None:
        return None
    return ["--keep_dequantized_layers", str(keep)] + (["--keep_activation_layers", str(activations)] if activations else [])


def run_one(a, peer, shape, ctx, bs, ckpt, start, results, logf, extra=()):
    left = a.budget - (time.time() - start) if a.budget else a.timeout
    if a.budget and left < 30:
        print(f"skip {peer} {shape} ctx{ctx} bs{bs}: the --budget is spent", file=sys.stderr)
        return None
    with tempfile.TemporaryDirectory(prefix="bench-") as workdir:
        cmd, to_record = PEERS[peer](a, peer, shape, ctx, bs, ckpt, workdir)
        cmd = cmd + list(extra)
        name = f"{peer} {shape} ctx{ctx} bs{bs} ckpt={'on' if ckpt else 'off'}"
        logf.write(f"\n===== {name}\n$ {shlex.join(cmd)}\n")
        logf.flush()
        t0 = time.time()
        # Its own process group, so that a timeout also ends what it started (torch.compile's workers).
        child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 start_new_session=True)
        try:
            out, err = child.communicate(timeout=min(a.timeout, left))
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            out, err = child.communicate()
            timed_out = True
        proc = subprocess.CompletedProcess(cmd, child.returncode, out, err)
        logf.write(err + (out if peer in FSDPQ_PEERS else "") + "\n")
        try:
            rec = {"timeout": True} if timed_out else to_record(proc)
        except (OSError, ValueError, KeyError, TypeError) as e:  # e.g. fsdpq wrote no metrics.jsonl
            rec = {"error": f"no result readable: {type(e).__name__}: {e}"}
    rec.update(peer=peer, model_shape=shape, context_length=ctx, batch_size=bs, gradient_checkpointing=ckpt,
               lora_dropout=a.lora_dropout, lora_rank=a.lora_rank, rc=None if timed_out else proc.returncode, wall_s=round(time.time() - t0, 1),
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               command=shlex.join(cmd))
    for flag in ("--keep_dequantized_layers", "--keep_activation_layers"):
        if flag in extra:
            rec[flag[2:]] = int(extra[list(extra).index(flag) + 1])
    if peer in FSDPQ_PEERS and a.fsdpq_args:
        rec["fsdpq_args"] = a.fsdpq_args  # a variant of its own in compare.py's tables
    if peer in FSDPQ_PEERS and fsdpq_environment():
        rec["fsdpq_env"] = fsdpq_environment()  # likewise
    results.write(json.dumps(rec) + "\n")
    results.flush()
    tps = rec.get("tokens_per_second")
    what = ("OOM" if rec.get("oom") else "timeout" if rec.get("timeout") else rec.get("error")
            or (f"{tps:,.0f} tok/s" if tps else "no tokens/s"))
    print(f"{name}: {what} ({rec['wall_s']} s)", file=sys.stderr, flush=True)
    return rec


if __name__ == "__main__":
    main()
