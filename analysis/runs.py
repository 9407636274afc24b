"""Reading fsdpq run directories: metrics.jsonl (docs/metrics.md) and a sweep's sweep.jsonl.

Every problem with a file is a RunError whose text is one line naming the file and, where there is
one, the line: callers print it and skip the run, so a damaged file never ends in a traceback.
"""

import json
import os
from dataclasses import dataclass, field

METRICS_FILE = "metrics.jsonl"
MANIFEST_FILE = "sweep.jsonl"


class RunError(Exception):
    def __init__(self, path, line, message):
        self.path, self.line, self.message = path, line, message
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {message}")


@dataclass
class Run:
    """One run's records, in file order. A resumed run has several headers; each starts a segment."""
    path: str                      # the metrics.jsonl file
    header: dict                   # the first header (the settings of the run)
    headers: list = field(default_factory=list)
    steps: list = field(default_factory=list)   # (segment index, step record)
    memory: list = field(default_factory=list)
    evals: list = field(default_factory=list)
    summary: dict = None
    preempted: list = field(default_factory=list)

    @property
    def directory(self):
        return os.path.dirname(self.path)

    @property
    def complete(self):
        return self.summary is not None


def _number(record, key):
    value = record.get(key)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_records(path):
    """Yields (line number, record) for every non-blank line; RunError on the first bad line."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise RunError(path, None, f"cannot read: {e.strerror}") from None
    if not data.strip():
        raise RunError(path, None, "empty metrics file (the run wrote nothing: it failed at start-up or was killed)")
    lines = data.split(b"\n")
    last = max(i for i, raw in enumerate(lines) if raw.strip())
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        number = i + 1
        try:
            record = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            # fsdpq ends every record with a newline, so an unterminated bad last line was cut off.
            if i == last and not data.endswith(b"\n"):
                raise RunError(path, number, "the last line is cut off mid-record (the run was killed while "
                                             "writing it?)") from None
            shown = raw[:40].decode("utf-8", "replace")
            raise RunError(path, number, f"not JSON ({getattr(e, 'msg', e)}): {shown!r}") from None
        if not isinstance(record, dict) or not isinstance(record.get("type"), str):
            raise RunError(path, number, 'not a metrics record (a JSON object with a "type")')
        yield number, record


def _drop_redone_steps(run, header):
    """A run continued from step S redoes the steps after S: their earlier records no longer count.

    fsdpq marks them "superseded" itself (docs/metrics.md); files written before it did still hold
    them as "step" records, and the header of the continuing segment says where it resumed.
    """
    resumed = header.get("resumed_from")
    if not isinstance(resumed, dict) or not _number(resumed, "step"):
        return
    last_kept = resumed["step"]
    run.steps = [(segment, r) for segment, r in run.steps if not _number(r, "step") or r["step"] <= last_kept]
    run.evals = [r for r in run.evals if not _number(r, "step") or r["step"] <= last_kept]


def read_run(path):
    """Reads and checks one metrics.jsonl; RunError (one line, file and line) when it cannot be used."""
    run = None
    for number, record in read_records(path):
        kind = record["type"]
        if run is None:
            if kind != "header":
                raise RunError(path, number, f"the first record is a '{kind}' record, not the header "
                                             "(the header line is missing)")
        if kind == "header":
            for key in ("config", "model"):
                if not isinstance(record.get(key), dict):
                    raise RunError(path, number, f"the header has no '{key}' object")
            if run is None:
                run = Run(path=path, header=record)
            else:
                _drop_redone_steps(run, record)
            run.headers.append(record)
        elif kind == "step":
            for key in ("step_seconds", "tokens"):
                if not _number(record, key):
                    raise RunError(path, number, f"step record without a numeric '{key}'")
            if record["step_seconds"] <= 0:
                raise RunError(path, number, f"step record with step_seconds = {record['step_seconds']}")
            run.steps.append((len(run.headers) - 1, record))
        elif kind == "memory":
            run.memory.append(record)
        elif kind == "eval":
            run.evals.append(record)
        elif kind == "summary":
            run.summary = record
        elif kind == "preempted":
            run.preempted.append(record)
        # Other types are newer than this reader: ignored, so old scripts keep working.
    return run


def has_summary(path):
    """Whether a metrics file holds a summary record (a finished run); never raises."""
    try:
        for _, record in read_records(path):
            if record["type"] == "summary":
                return True
    except RunError:
        # A damaged file may still hold the summary before the damage; not finished otherwise.
        pass
    return False


def find_metrics(root):
    """Every metrics.jsonl at or below root (a file or a directory), sorted."""
    if os.path.isfile(root):
        return [root]
    found = []
    for directory, subdirs, files in os.walk(root):
        subdirs.sort()
        if METRICS_FILE in files:
            found.append(os.path.join(directory, METRICS_FILE))
    return sorted(found)


def find_manifests(root):
    if os.path.isfile(root):
        return []
    found = []
    for directory, subdirs, files in os.walk(root):
        if MANIFEST_FILE in files:
            found.append(os.path.join(directory, MANIFEST_FILE))
    return sorted(found)


def read_manifest(path):
    """The latest entry per point of a sweep.jsonl (a skipped entry does not hide an earlier attempt)."""
    latest = {}
    for number, record in read_records(path):
        point = record.get("point")
        if not isinstance(point, str):
            raise RunError(path, number, "manifest entry without a 'point' name")
        if record.get("status") == "skipped" and point in latest:
            continue
        latest[point] = record
    return latest
