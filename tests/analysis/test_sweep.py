"""analysis/sweep.py driving the real CPU fsdpq binary on the tiny preset (3 steps, about a second a run).

Failures are real too: context 64 leaves the dummy records no answer token (fsdpq exits 2 at data
preparation), and fsdpq's own fault injection (FSDPQ_INJECT_FAULT, set through the launcher prefix)
preempts a run with SIGUSR1 (checkpoint, exit 75) or kills it with SIGKILL as the OOM killer would.
"""

import json
import os
import shutil

import pytest
from conftest import FIXTURES, run_script

import sweep

TINY = os.path.join(FIXTURES, "tiny.ini")
MPIRUN = shutil.which("mpirun")


def manifest(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def test_grid_runs_every_point_records_failures_and_resumes(tmp_path, fsdpq):
    args = [TINY, "--name", "s", "--runs-dir", tmp_path, "--fsdpq", fsdpq,
            "--grid", "context_length=64,256", "batch_size=1,2", "--set", "max_steps=2"]
    first = run_script("sweep.py", *args)
    assert first.returncode == 1, first.stdout + first.stderr  # two points failed, the sweep went on
    names = ["ctx64_bs1", "ctx64_bs2", "ctx256_bs1", "ctx256_bs2"]
    entries = manifest(tmp_path / "s" / "sweep.jsonl")
    assert [e["point"] for e in entries] == names
    assert [e["status"] for e in entries] == ["failed", "failed", "ok", "ok"]
    assert [e["exit_code"] for e in entries] == [2, 2, 0, 0]
    assert "increase context_length" in entries[0]["message"]
    assert all(e["wall_seconds"] > 0 and e["command"][:2] == [fsdpq, TINY] for e in entries)
    assert entries[3]["settings"] == {"context_length": "256", "batch_size": "2"}
    for e in entries[2:]:
        recs = metrics(tmp_path / "s" / e["point"] / "metrics.jsonl")
        assert recs[0]["config"]["batch_size"] == e["settings"]["batch_size"]
        assert recs[0]["config"]["max_steps"] == "2" and recs[0]["config"]["output_dir"] == str(tmp_path / "s" / e["point"])
        assert recs[-1]["type"] == "summary" and recs[-1]["steps"] == 2
    assert "no training example keeps any answer token" in (tmp_path / "s" / "ctx64_bs1" / "fsdpq.log").read_text()
    done = os.path.getmtime(tmp_path / "s" / "ctx256_bs1" / "metrics.jsonl")

    # Again: finished points are skipped (untouched), failed ones are tried again.
    second = run_script("sweep.py", *args)
    assert second.returncode == 1
    entries = manifest(tmp_path / "s" / "sweep.jsonl")[4:]
    assert [e["status"] for e in entries] == ["failed", "failed", "skipped", "skipped"]
    assert os.path.getmtime(tmp_path / "s" / "ctx256_bs1" / "metrics.jsonl") == done
    # --skip-failed: nothing left to run.
    third = run_script("sweep.py", *args, "--skip-failed")
    assert third.returncode == 0, third.stdout
    assert [e["status"] for e in manifest(tmp_path / "s" / "sweep.jsonl")[8:]] == ["skipped"] * 4

    # The analysis reads the sweep: two runs and the two failed points.
    report = run_script("summarize.py", tmp_path / "s")
    assert report.returncode == 0, report.stderr
    assert "| ctx256_bs1 | 1 |" in report.stdout and "| ctx256_bs2 | 2 |" in report.stdout
    failed = report.stdout.split("## Failed points")[1]
    assert "| ctx64_bs1 |" in failed and "| ctx64_bs2 |" in failed and "| ctx256" not in failed


def test_preempted_point_stops_the_sweep_with_75_and_the_rerun_resumes_it(tmp_path, fsdpq):
    args = [TINY, "--name", "p", "--runs-dir", tmp_path, "--fsdpq", fsdpq, "--grid", "batch_size=1,2"]
    # Slurm's notice before preemption, delivered by fsdpq's fault injection after step 1.
    first = run_script("sweep.py", *args, "--launcher", "env FSDPQ_INJECT_FAULT=0:after_step_1:usr1")
    assert first.returncode == 75, first.stdout + first.stderr
    entries = manifest(tmp_path / "p" / "sweep.jsonl")
    assert [(e["point"], e["status"], e["exit_code"]) for e in entries] == [("bs1", "preempted", 75)]
    assert not (tmp_path / "p" / "bs2").exists()  # the job is ending: no new point starts

    second = run_script("sweep.py", *args)
    assert second.returncode == 0, second.stdout + second.stderr
    assert [e["status"] for e in manifest(tmp_path / "p" / "sweep.jsonl")[1:]] == ["ok", "ok"]
    recs = metrics(tmp_path / "p" / "bs1" / "metrics.jsonl")
    headers = [r for r in recs if r["type"] == "header"]
    assert len(headers) == 2 and headers[1]["resumed_from"]["step"] == 1  # resume=auto continued it
    assert [r["step"] for r in recs if r["type"] == "step"] == [1, 2, 3]


def test_killed_points_are_recorded_and_the_sweep_goes_on(tmp_path, fsdpq):
    result = run_script("sweep.py", TINY, "--name", "k", "--runs-dir", tmp_path, "--fsdpq", fsdpq,
                        "--grid", "batch_size=1,2", "--launcher", "env FSDPQ_INJECT_FAULT=0:after_step_1:kill")
    assert result.returncode == 1
    entries = manifest(tmp_path / "k" / "sweep.jsonl")
    assert [(e["status"], e["exit_code"]) for e in entries] == [("killed", 137), ("killed", 137)]
    assert "SIGKILL" in entries[0]["message"]


@pytest.mark.skipif(MPIRUN is None, reason="mpirun is not installed (Debian: openmpi-bin)")
def test_launcher_placeholder_sets_the_rank_count(tmp_path, fsdpq):
    result = run_script("sweep.py", TINY, "--name", "m", "--runs-dir", tmp_path, "--fsdpq", fsdpq,
                        "--grid", "np=2", "--launcher", f"{MPIRUN} --allow-run-as-root --oversubscribe -np {{np}}")
    assert result.returncode == 0, result.stdout + result.stderr
    entry = manifest(tmp_path / "m" / "sweep.jsonl")[0]
    assert entry["point"] == "np2" and entry["command"][:6] == [MPIRUN, "--allow-run-as-root", "--oversubscribe",
                                                                "-np", "2", fsdpq]
    assert not any(arg.startswith("--np") for arg in entry["command"])  # a launcher key, not an fsdpq setting
    assert metrics(tmp_path / "m" / "np2" / "metrics.jsonl")[0]["world_size"] == 2


def test_points_file_toml_crossed_with_the_grid(tmp_path, fsdpq):
    points = tmp_path / "points.toml"
    points.write_text('name = "t"\n[set]\nmax_steps = 2\n[grid]\nuse_gradient_checkpointing = [true, false]\n'
                      '[[points]]\nname = "lora"\ntrain_type = "lora"\n[[points]]\ntrain_type = "qlora"\n')
    result = run_script("sweep.py", TINY, "--points", points, "--runs-dir", tmp_path, "--fsdpq", fsdpq, "--dry-run")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 4 and all("--max_steps=2" in line for line in lines)
    assert [line.split("--output_dir=")[1].split()[0] for line in lines] == [
        str(tmp_path / "t" / n) for n in ("lora_ckpt", "lora_no-ckpt", "qlora_ckpt", "qlora_no-ckpt")]
    assert not (tmp_path / "t").exists()  # a dry run runs nothing


def test_names_and_the_cross_product():
    points = sweep.expand([{"name": "best", "batch_size": "8"}, {"sharding_strategy": "ddp"}],
                          {"use_cpu_offload": ["true", "false"], "context_length": ["512"]})
    assert [n for n, _ in points] == ["best_offload_ctx512", "best_no-offload_ctx512", "ddp_offload_ctx512",
                                      "ddp_no-offload_ctx512"]
    assert points[0][1] == {"batch_size": "8", "use_cpu_offload": "true", "context_length": "512"}
    assert sweep.name_part("model_name", "preset:llama2-7b") == "llama2-7b"
    assert sweep.name_part("lr", "2e-4") == "lr-2e-4"
    with pytest.raises(sweep.SweepError, match="both set batch_size"):
        sweep.expand([{"batch_size": "1"}], {"batch_size": ["2"]})
    with pytest.raises(sweep.SweepError, match="both named 'x'"):
        sweep.expand([{"name": "x", "lr": "1"}, {"name": "x", "lr": "2"}], {})


@pytest.mark.parametrize("extra, message", [
    (["--grid", "batch_size"], "--grid 'batch_size': expected KEY=VALUE"),
    (["--grid", "batch_size=1,,2"], "an empty value"),
    (["--grid", "batch_sise=1,2"], "point batch_sise-1: fsdpq: error: command line: '--batch_sise' is not a known "
                                   "setting (did you mean '--batch_size'?)"),
    (["--grid", "batch_size=1,x"], "point bsx: fsdpq: error: command line: --batch_size x: expected an integer"),
    (["--grid", "batch_size=1", "--set", "output_dir=elsewhere"], "'output_dir' is set by the sweep"),
    (["--grid", "batch_size=1", "--launcher", "mpirun -np {np}"], "the launcher uses {np}, which the point does not set"),
    ([], "no points"),
])
def test_bad_sweep_definitions_exit_2_with_one_line(tmp_path, fsdpq, extra, message):
    result = run_script("sweep.py", TINY, "--runs-dir", tmp_path, "--fsdpq", fsdpq, *extra)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sweep: error: "), result.stderr
    assert message in result.stderr, result.stderr
    assert os.listdir(tmp_path) == []  # nothing ran


def test_bad_points_file_names_the_file(tmp_path, fsdpq):
    bad = tmp_path / "points.json"
    bad.write_text('{"points": [{"batch_size": 1},]}')
    result = run_script("sweep.py", TINY, "--points", bad, "--fsdpq", fsdpq)
    assert result.returncode == 2 and f"{bad}: not valid JSON" in result.stderr
    bad.write_text('{"pionts": []}')
    result = run_script("sweep.py", TINY, "--points", bad, "--fsdpq", fsdpq)
    assert result.returncode == 2 and "unknown top-level key(s) pionts" in result.stderr


def test_a_signal_to_the_sweep_reaches_the_running_point(tmp_path, fsdpq):
    # As Slurm's --signal does to the batch step: the sweep forwards it, fsdpq checkpoints and exits
    # 75, the sweep records the point as preempted, starts nothing more and exits 75 for the requeue.
    import signal
    import subprocess
    import sys
    import time
    from conftest import REPO
    command = [sys.executable, os.path.join(REPO, "analysis", "sweep.py"), TINY, "--name", "sig", "--runs-dir",
               str(tmp_path), "--fsdpq", fsdpq, "--grid", "batch_size=1,2", "--set", "max_steps=100000",
               "num_epochs=100000"]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics_file = tmp_path / "sig" / "bs1" / "metrics.jsonl"
    deadline = time.monotonic() + 60
    while not (metrics_file.exists() and '"type":"step"' in metrics_file.read_text()):
        assert time.monotonic() < deadline and child.poll() is None, "the point never started training"
        time.sleep(0.1)
    child.send_signal(signal.SIGTERM)
    out, err = child.communicate(timeout=60)
    assert child.returncode == 75, out + err
    entries = manifest(tmp_path / "sig" / "sweep.jsonl")
    assert [(e["point"], e["status"], e["exit_code"]) for e in entries] == [("bs1", "preempted", 75)]
    assert any(r["type"] == "preempted" and r["signal"] == "SIGTERM" for r in metrics(metrics_file))
    assert not (tmp_path / "sig" / "bs2").exists()
