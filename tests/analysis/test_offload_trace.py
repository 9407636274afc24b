"""analysis/offload_trace.py on a trace written the way fsdpq's TraceWriter writes one."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "analysis", "offload_trace.py")
sys.path.insert(0, os.path.join(HERE, "..", "..", "analysis"))
import offload_trace  # noqa: E402


def span(name, ts, dur, tid="comm"):
    return {"name": name, "cat": tid, "ph": "X", "pid": 0, "tid": tid, "ts": ts, "dur": dur, "args": {}}


def trace():
    events = []
    for s in range(3):  # steps of 10 ms, 10,000 µs apart
        t = s * 10000
        events.append(span(f"step {s + 1}", t, 10000, "step"))
        events.append(span("update wait (layer 0)", t + 100, 2000))
        events.append(span("update wait (layer 1)", t + 2500, 30))
        events.append(span("norm wait (all units)", t + 9000, 500))
        events.append(span("host copy-out wait (layer 1)", t + 7000, 200, "host worker"))
        events.append(span("host accumulate (layer 1)", t + 7200, 800, "host worker"))
        events.append(span("host update (layer 0)", t + 9600, 300, "host worker"))
    return events


def test_per_step_sums_after_the_warm_up():
    rows = offload_trace.summarize(trace(), skip=1)
    assert [r["step"] for r in rows] == ["step 2", "step 3"]
    r = rows[0]
    assert r["step_ms"] == 10.0
    assert r["update wait"] == 2.03 and r["first update wait"] == 2.0
    assert r["units waited for"] == 1  # the 30 µs wait is below the 50 µs floor
    assert r["norm wait"] == 0.5
    assert (r["host copy-out wait"], r["host accumulate"], r["host update"]) == (0.2, 0.8, 0.3)


def test_the_command_prints_a_table_and_names_a_bad_file(tmp_path):
    good = tmp_path / "trace.rank0.json"
    good.write_text(json.dumps(trace()))
    out = subprocess.run([sys.executable, SCRIPT, str(good)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "| step 2 | 10.0 | 0.5 | 2.0 | 2.0 | 1 | 0.2 | 0.8 | 0.3 |" in out.stdout
    bad = tmp_path / "cut.json"
    bad.write_text('[{"name": "step 1"')
    out = subprocess.run([sys.executable, SCRIPT, str(bad)], capture_output=True, text=True)
    assert out.returncode != 0 and "cut.json: not a readable fsdpq trace" in out.stderr
