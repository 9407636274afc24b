#!/usr/bin/env python3
"""Run fsdpq once per point of a sweep, each into runs/<sweep>/<point>/ (docs/analysis.md).

  python3 analysis/sweep.py inputs/dummy_7b.ini --name 7b_2gpu \\
      --grid train_type=lora,qlora sharding_strategy=full_shard,ddp batch_size=1,2,4 \\
      --set max_steps=5 --launcher "srun"

Points come from --grid (every combination), a --points file (JSON or TOML: "points", "grid",
"set", optionally "base" and "name"), or both (every listed point crossed with the grid). Each
point runs as `[LAUNCHER] FSDPQ BASE.ini --key value ... --output_dir RUNS/SWEEP/POINT --resume
auto`, its output in RUNS/SWEEP/POINT/fsdpq.log, one line per attempt in RUNS/SWEEP/sweep.jsonl.
A point whose metrics.jsonl has a summary record is skipped, so rerunning the same command (or a
requeued job) continues where it stopped. A failing point (out of memory, an error) is recorded and
the sweep goes on. Exit code: 0 every point done, 1 some point failed, 2 a bad sweep definition,
75 stopped by a signal or a preempted point (requeue the job: the rerun resumes).
"""

import argparse
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import string
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from runs import MANIFEST_FILE, METRICS_FILE, RunError, has_summary, read_records  # noqa: E402

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_REQUEUE = 0, 1, 2, 75
FSDPQ_CHECKPOINTED = 75  # src/runtime/exit_codes.h: preempted, checkpoint written
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OWNED_KEYS = ("output_dir", "resume")  # the sweep sets these for every point
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)
OOM_PATTERNS = re.compile(r"out of memory|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation|std::bad_alloc",
                          re.IGNORECASE)

# Short, readable point names: `qlora_ddp_offload_no-ckpt_bs4_ctx2048`.
VALUE_ONLY = ("train_type", "sharding_strategy", "precision", "optimizer")
BOOL_NAMES = {"use_cpu_offload": "offload", "use_gradient_checkpointing": "ckpt",
              "use_activation_cpu_offload": "act-offload", "no_sync": "no-sync", "low_memory": "low-mem"}
NUMBER_NAMES = {"batch_size": "bs", "context_length": "ctx", "gradient_accumulation_steps": "gas",
                "lora_rank": "r", "max_steps": "steps", "dataset_samples": "samples", "np": "np"}


class SweepError(Exception):
    """A bad sweep definition: one line, exit code 2."""


def text(value):
    """A point value as fsdpq's command line takes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    raise SweepError(f"value {value!r} is not a string, number or boolean")


def clean(value):
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", value).strip("-") or "x"


def name_part(key, value):
    if key in VALUE_ONLY:
        return clean(value)
    if key in BOOL_NAMES and value in ("true", "false"):
        return BOOL_NAMES[key] if value == "true" else "no-" + BOOL_NAMES[key]
    if key in NUMBER_NAMES:
        return NUMBER_NAMES[key] + clean(value)
    if key == "model_name":
        return clean(value.rstrip("/").split("/")[-1].replace("preset:", ""))
    return clean(key) + "-" + clean(value)


def parse_assignments(items, option, many):
    """`key=v1,v2` (many) or `key=value` items into an ordered dict."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().lstrip("-")
        if not sep or not key:
            raise SweepError(f"{option} {item!r}: expected KEY=VALUE" + ("[,VALUE...]" if many else ""))
        if many:
            values = [v.strip() for v in value.split(",")]
            if any(v == "" for v in values):
                raise SweepError(f"{option} {item!r}: an empty value (values are separated by single commas)")
            out[key] = values
        else:
            out[key] = value
    return out


def load_points_file(path):
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise SweepError(f"{path}: cannot read: {e.strerror}") from None
    try:
        if path.endswith(".toml"):
            import tomllib
            data = tomllib.loads(raw.decode("utf-8"))
        else:
            data = json.loads(raw.decode("utf-8"))
    except Exception as e:  # tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError
        raise SweepError(f"{path}: not valid {'TOML' if path.endswith('.toml') else 'JSON'}: {e}") from None
    if isinstance(data, list):
        data = {"points": data}
    if not isinstance(data, dict):
        raise SweepError(f"{path}: expected an object with 'points', 'grid' and/or 'set'")
    unknown = set(data) - {"points", "grid", "set", "base", "name"}
    if unknown:
        raise SweepError(f"{path}: unknown top-level key(s) {', '.join(sorted(unknown))} "
                         "(allowed: points, grid, set, base, name)")
    points = data.get("points", [])
    if not isinstance(points, list) or not all(isinstance(p, dict) for p in points):
        raise SweepError(f"{path}: 'points' must be a list of objects (key: value)")
    grid = data.get("grid", {})
    if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
        raise SweepError(f"{path}: 'grid' must map each key to a non-empty list of values")
    fixed = data.get("set", {})
    if not isinstance(fixed, dict):
        raise SweepError(f"{path}: 'set' must be an object (key: value)")
    try:
        return {"points": [{k: (v if k == "name" else text(v)) for k, v in p.items()} for p in points],
                "grid": {k: [text(v) for v in vs] for k, vs in grid.items()},
                "set": {k: text(v) for k, v in fixed.items()},
                "base": data.get("base"), "name": data.get("name")}
    except SweepError as e:
        raise SweepError(f"{path}: {e}") from None


def expand(points, grid):
    """Every listed point crossed with every grid combination: [(name, {key: value})]."""
    keys = list(grid)
    combos = [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]
    out, seen = [], {}
    for index, point in enumerate(points or [{}]):
        given_name = point.get("name")
        settings = {k: v for k, v in point.items() if k != "name"}
        for combo in combos:
            clash = set(settings) & set(combo)
            if clash:
                raise SweepError(f"point {index + 1} and the grid both set {', '.join(sorted(clash))}")
            merged = {**settings, **combo}
            parts = [clean(str(given_name))] if given_name else [name_part(k, v) for k, v in settings.items()]
            parts += [name_part(k, v) for k, v in combo.items()]
            name = "_".join(parts) or "default"
            if name in seen:
                raise SweepError(f"two points are both named '{name}' ({seen[name]} and {merged}); "
                                 "give them distinct 'name's")
            seen[name] = merged
            out.append((name, merged))
    return out


def launcher_keys(launcher):
    """The {placeholders} of the launcher: point keys that go to the launcher, not to fsdpq."""
    return [field for _, field, _, _ in string.Formatter().parse(launcher) if field]


def build_command(args, settings):
    keys = launcher_keys(args.launcher)
    prefix = shlex.split(args.launcher.format(**{k: settings[k] for k in keys})) if args.launcher else []
    overrides = [f"--{k}={v}" for k, v in {**args.fixed, **settings}.items() if k not in keys]
    return prefix, [args.fsdpq, args.base] + overrides


def check_point(args, name, settings):
    """Let fsdpq resolve the point's config (fast, no model load): bad keys or values fail here."""
    _, command = build_command(args, settings)
    result = subprocess.run(command + ["--print-config"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    if result.returncode != 0:
        message = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else f"exit code {result.returncode}"
        raise SweepError(f"point {name}: {message}")


def last_error(log_path):
    try:
        with open(log_path, errors="replace") as f:
            lines = [line.strip() for line in f if line.strip()]
    except OSError:
        return ""
    errors = [line for line in lines if "error" in line.lower()]
    return (errors[-1] if errors else lines[-1] if lines else "")[:300]


def classify(code, log_path, timed_out, interrupted):
    """(status, message) of a finished point."""
    message = last_error(log_path)
    if code == 0:
        return "ok", ""
    if timed_out:
        return "timeout", message
    if code == FSDPQ_CHECKPOINTED:
        return "preempted", message
    if interrupted:
        return "interrupted", message
    try:
        with open(log_path, errors="replace") as f:
            if OOM_PATTERNS.search(f.read()):
                return "oom", message
    except OSError:
        pass
    if code in (137, -signal.SIGKILL):
        return "killed", "killed by SIGKILL (the host's out-of-memory killer?)" + (f"; last output: {message}"
                                                                                  if message else "")
    return "failed", message


class Runner:
    """Runs one child at a time in its own process group and forwards our signals to it."""

    def __init__(self):
        self.child = None
        self.stop_signal = None
        for s in FORWARDED_SIGNALS:
            signal.signal(s, self.on_signal)

    def on_signal(self, signum, frame):
        self.stop_signal = signum
        if self.child and self.child.poll() is None:
            try:
                os.killpg(self.child.pid, signum)
            except ProcessLookupError:
                pass

    def run(self, command, log_path, timeout):
        with open(log_path, "wb") as log:
            log.write(("$ " + shlex.join(command) + "\n").encode())
            log.flush()
            self.child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            timed_out = False
            deadline = time.monotonic() + timeout if timeout else None
            while True:
                try:
                    code = self.child.wait(timeout=None if deadline is None else max(0.1, deadline - time.monotonic()))
                    break
                except subprocess.TimeoutExpired:
                    timed_out = True
                    os.killpg(self.child.pid, signal.SIGTERM)
                    try:
                        code = self.child.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        os.killpg(self.child.pid, signal.SIGKILL)
                        code = self.child.wait()
                    break
            self.child = None
        return (128 - code if code < 0 else code), timed_out


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="See docs/analysis.md.")
    p.add_argument("base", nargs="?", help="the base .ini every point starts from (or 'base' in --points)")
    p.add_argument("--name", help="the sweep's name: runs go to RUNS_DIR/NAME/ (default: the points file's or "
                                  "the base config's file name)")
    p.add_argument("--grid", nargs="+", default=[], metavar="KEY=V1,V2", help="every combination of these values")
    p.add_argument("--points", metavar="FILE", help="JSON or TOML file: points (a list of {key: value}), grid, set")
    p.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", dest="fixed_items",
                   help="settings given to every point (win over the points file's 'set')")
    p.add_argument("--launcher", default="", help="command prefix, e.g. 'srun' or 'mpirun -np {np}' ({KEY} is the "
                                                  "point's value of KEY, which then is not passed to fsdpq)")
    p.add_argument("--fsdpq", help="the fsdpq binary (default: ./fsdpq of this checkout, else fsdpq on PATH)")
    p.add_argument("--runs-dir", default="runs", help="where sweeps go (default: runs)")
    p.add_argument("--timeout", type=float, default=0, help="seconds per point before it is stopped (0: none)")
    p.add_argument("--skip-failed", action="store_true", help="do not retry points whose last attempt failed")
    p.add_argument("--no-check", action="store_true", help="do not check every point's config before running")
    p.add_argument("--dry-run", action="store_true", help="print the commands and stop")
    return p.parse_args(argv)


def resolve(args):
    """Fills in args.points_list, args.grid_dict, args.fixed, args.base, args.name, args.fsdpq; SweepError."""
    from_file = load_points_file(args.points) if args.points else {"points": [], "grid": {}, "set": {},
                                                                    "base": None, "name": None}
    args.base = args.base or from_file["base"]
    if not args.base:
        raise SweepError("no base config: give BASE.ini (or 'base' in the points file)")
    if not os.path.isfile(args.base):
        raise SweepError(f"base config {args.base}: no such file")
    grid = {**from_file["grid"], **parse_assignments(args.grid, "--grid", True)}
    args.fixed = {**from_file["set"], **parse_assignments(args.fixed_items, "--set", False)}
    if not grid and not from_file["points"]:
        raise SweepError("no points: give --grid KEY=V1,V2 ... and/or --points FILE")
    args.points_list = expand(from_file["points"], grid)
    placeholders = launcher_keys(args.launcher)
    for name, settings in args.points_list:
        missing = [k for k in placeholders if k not in settings]
        if missing:
            raise SweepError(f"point {name}: the launcher uses {{{missing[0]}}}, which the point does not set")
        owned = [k for k in OWNED_KEYS if k in settings or k in args.fixed]
        if owned:
            raise SweepError(f"point {name}: '{owned[0]}' is set by the sweep (each point gets its own run directory)")
    args.name = args.name or from_file["name"] or os.path.splitext(os.path.basename(args.points or args.base))[0]
    if clean(args.name) != args.name:
        raise SweepError(f"sweep name {args.name!r}: use letters, digits, '.', '_', '+' and '-' only")
    if args.fsdpq is None:
        local = os.path.join(REPO, "fsdpq")
        args.fsdpq = local if os.access(local, os.X_OK) else shutil.which("fsdpq")
        if args.fsdpq is None:
            raise SweepError("no fsdpq binary: build it (make) or give --fsdpq PATH")
    elif not os.access(args.fsdpq, os.X_OK):
        raise SweepError(f"--fsdpq {args.fsdpq}: not an executable file")


def previous_failures(manifest):
    """Points whose latest real attempt failed for a reason a rerun would not fix."""
    failed = {}
    if not os.path.isfile(manifest):
        return failed
    try:
        for _, record in read_records(manifest):
            if record.get("status") != "skipped":
                failed[record.get("point")] = record.get("status") in ("failed", "oom", "killed", "timeout")
    except RunError as e:
        print(f"sweep: warning: {e}", file=sys.stderr)
    return {p for p, bad in failed.items() if bad}


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        resolve(args)
        if not args.no_check and not args.dry_run:
            for name, settings in args.points_list:
                check_point(args, name, settings)
    except SweepError as e:
        print(f"sweep: error: {e}", file=sys.stderr)
        return EXIT_USAGE

    sweep_dir = os.path.join(args.runs_dir, args.name)
    manifest_path = os.path.join(sweep_dir, MANIFEST_FILE)
    total = len(args.points_list)
    if args.dry_run:
        for name, settings in args.points_list:
            prefix, command = build_command(args, settings)
            print(shlex.join(prefix + command + [f"--output_dir={os.path.join(sweep_dir, name)}", "--resume=auto"]))
        return EXIT_OK

    os.makedirs(sweep_dir, exist_ok=True)
    skip_failed = previous_failures(manifest_path) if args.skip_failed else set()
    runner = Runner()
    counts = {}
    for index, (name, settings) in enumerate(args.points_list, 1):
        if runner.stop_signal:
            break
        run_dir = os.path.join(sweep_dir, name)
        prefix, command = build_command(args, settings)
        # resume=auto: a point that was preempted continues from its checkpoint (none: a fresh start).
        command = prefix + command + [f"--output_dir={run_dir}", "--resume=auto"]
        entry = {"type": "point", "sweep": args.name, "point": name, "settings": settings, "set": args.fixed,
                 "command": command, "run_dir": run_dir}
        if has_summary(os.path.join(run_dir, METRICS_FILE)) or name in skip_failed:
            why = "complete" if name not in skip_failed else "failed before (--skip-failed)"
            entry.update(status="skipped", message=why)
            print(f"[{index}/{total}] {name}: skipped ({why})", flush=True)
        else:
            os.makedirs(run_dir, exist_ok=True)
            log_path = os.path.join(run_dir, "fsdpq.log")
            print(f"[{index}/{total}] {name}: {shlex.join(command)}", flush=True)
            started = time.time()
            code, timed_out = runner.run(command, log_path, args.timeout)
            wall = time.time() - started
            status, message = classify(code, log_path, timed_out, runner.stop_signal is not None)
            entry.update(status=status, exit_code=code, started_unix=started, wall_seconds=round(wall, 3),
                         message=message, log=log_path)
            print(f"[{index}/{total}] {name}: {status} (exit code {code}, {wall:.1f} s)"
                  + (f": {message}" if message else ""), flush=True)
        counts[entry["status"]] = counts.get(entry["status"], 0) + 1
        with open(manifest_path, "a") as f:
            f.write(json.dumps(entry) + "\n")
        if entry["status"] == "preempted":
            break  # the job is about to end: the rerun resumes this point first

    done = sum(counts.values())
    print(f"sweep {args.name}: {done}/{total} points: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
          + f"; manifest {manifest_path}", flush=True)
    if runner.stop_signal or counts.get("preempted") or done < total:
        return EXIT_REQUEUE
    bad = sum(n for s, n in counts.items() if s not in ("ok", "skipped"))
    return EXIT_FAILED if bad else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
