"""analysis/summarize.py on the recorded fixture runs (fixtures/README.md says how each was made).

Expected numbers are computed here from the fixture files with plain json, independently of the
script's code, so re-recording the fixtures keeps the tests meaningful.
"""

import json
import os
import shutil

import pytest
from conftest import FIXTURES, run_script

import summarize
from runs import read_run
from shapes import flops_per_token

RUNS = os.path.join(FIXTURES, "runs")
DAMAGED = os.path.join(FIXTURES, "damaged")
GPU = os.path.join(FIXTURES, "gpu_h200")
RESUMED = os.path.join(FIXTURES, "resumed")


def records(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def edited_copy(tmp_path, name, edit):
    """The 2-rank tiny QLoRA run's metrics.jsonl copied to tmp_path/name/, each record through
    edit(record) (it returns the record to keep, or None to drop it)."""
    source = os.path.join(RUNS, "cpu_tiny", "qlora_bs1_ctx256_np2", "metrics.jsonl")
    target = tmp_path / name / "metrics.jsonl"
    target.parent.mkdir()
    kept = [r for r in map(edit, records(source)) if r is not None]
    target.write_text("".join(json.dumps(r) + "\n" for r in kept))
    return target


def tables(markdown):
    """{section title: [ {column: cell} ]} of the report's Markdown tables."""
    out, title, columns = {}, None, None
    for line in markdown.splitlines():
        if line.startswith("## "):
            title, columns = line[3:], None
        elif line.startswith("| ") and title:
            cells = [c.strip() for c in line.strip()[1:-1].split(" | ")]
            if columns is None:
                columns = cells
                out[title] = []
            elif not all(set(c) <= set(":-") for c in cells):
                out[title].append(dict(zip(columns, cells)))
    return out


def timed_steps(path, warmup=1):
    """Step records after the first `warmup` of each header's segment."""
    out, count = [], 0
    for r in records(path):
        if r["type"] == "header":
            count = 0
        elif r["type"] == "step":
            count += 1
            if count > warmup:
                out.append(r)
    return out


def by_run(rows):
    return {row["Run"]: row for row in rows}


def test_fixture_sweep_throughput_and_time_per_1024_samples():
    result = run_script("summarize.py", RUNS)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    rows = by_run(tables(result.stdout)["Throughput"])
    run_dirs = sorted(d for d in os.listdir(os.path.join(RUNS, "cpu_tiny"))
                      if os.path.exists(os.path.join(RUNS, "cpu_tiny", d, "metrics.jsonl")))
    assert sorted(rows) == [f"cpu_tiny/{d}" for d in run_dirs] and len(rows) == 6
    for d in run_dirs:
        steps = timed_steps(os.path.join(RUNS, "cpu_tiny", d, "metrics.jsonl"))
        seconds = sum(s["step_seconds"] for s in steps)
        row = rows[f"cpu_tiny/{d}"]
        assert row["Tokens/s"] == f"{sum(s['tokens'] for s in steps) / seconds:,.0f}"
        assert row["Time (s) / 1,024 samples"] == f"{seconds / sum(s['samples'] for s in steps) * 1024:,.1f}"
        assert row["Timed steps"] == str(len(steps))
        assert row["MFU"] == "—"  # no peak for a CPU
        header = records(os.path.join(RUNS, "cpu_tiny", d, "metrics.jsonl"))[0]
        summary = records(os.path.join(RUNS, "cpu_tiny", d, "metrics.jsonl"))[-1]
        assert row["Batch Size"] == header["config"]["batch_size"]
        assert row["Context Length"] == header["config"]["context_length"]
        assert row["Ranks"] == str(header["world_size"])
        assert row["Peak Host Memory (GiB)"] == f"{summary['peak_host_memory_bytes'] / 2 ** 30:.2f}"


def test_only_differing_settings_are_columns_and_the_rest_is_the_caption():
    out = run_script("summarize.py", RUNS).stdout
    columns = list(tables(out)["Throughput"][0])
    assert columns[:5] == ["Run", "Ranks", "Train Type", "Batch Size", "Context Length"]
    assert "Sharding" not in columns and "CPU Offload" not in columns
    assert "*Model preset:tiny, GPU CPU, Nodes 1, Precision bf16, Sharding full_shard, CPU Offload False" in out


def test_failed_sweep_points_are_listed():
    out = run_script("summarize.py", RUNS).stdout
    failed = tables(out)["Failed points"]
    manifest = [r for r in records(os.path.join(RUNS, "cpu_tiny", "sweep.jsonl")) if r["status"] == "failed"]
    assert [f["Run"] for f in failed] == [f"cpu_tiny/{r['point']}" for r in manifest] == ["cpu_tiny/qlora_bs1_ctx64_np1"]
    assert failed[0]["Exit code"] == "2" and "increase context_length" in failed[0]["Message"]


def test_step_time_breakdown_subtracts_the_disjoint_phases():
    rows = by_run(tables(run_script("summarize.py", RUNS).stdout)["Step time"])
    steps = timed_steps(os.path.join(RUNS, "cpu_tiny", "qlora_bs1_ctx256_np2", "metrics.jsonl"))
    n = len(steps)
    mean = {k: sum(s["phase_seconds"][k] for s in steps) / n for k in ("gather_wait", "reduce", "optimizer",
                                                                        "offload_copies")}
    step = sum(s["step_seconds"] for s in steps) / n
    compute = step - mean["gather_wait"] - mean["reduce"] - mean["optimizer"]  # offload copies lie inside those
    row = rows["cpu_tiny/qlora_bs1_ctx256_np2"]
    assert row["Step (ms)"] == f"{step * 1e3:,.1f}"
    assert row["Compute"] == f"{compute * 1e3:,.1f} ({compute / step:.0%})"
    assert row["Gather wait"] == f"{mean['gather_wait'] * 1e3:,.1f} ({mean['gather_wait'] / step:.0%})"
    assert row["Reduce"] == f"{mean['reduce'] * 1e3:,.1f} ({mean['reduce'] / step:.0%})"
    assert mean["gather_wait"] > 0 and mean["reduce"] > 0  # two ranks really communicate


def test_older_step_records_without_phase_seconds(tmp_path):
    # Today's first format: only gather_wait_seconds / reduce_seconds; optimizer and offload unknown.
    def without_phases(r):
        r.pop("phase_seconds", None)
        return None if r["type"] == "memory" else r

    target = edited_copy(tmp_path, "old", without_phases)
    result = run_script("summarize.py", target.parent)
    assert result.returncode == 0, result.stderr
    row = tables(result.stdout)["Step time"][0]
    steps = timed_steps(str(target))
    step = sum(s["step_seconds"] for s in steps) / len(steps)
    gather = sum(s["gather_wait_seconds"] for s in steps) / len(steps)
    reduce = sum(s["reduce_seconds"] for s in steps) / len(steps)
    assert row["Offload copies"] == row["Optimizer"] == "—"
    assert row["Compute"] == f"{(step - gather - reduce) * 1e3:,.1f} ({(step - gather - reduce) / step:.0%})"


def test_warmup_steps_are_left_out():
    zero = by_run(tables(run_script("summarize.py", RUNS, "--warmup", "0").stdout)["Throughput"])
    assert {r["Timed steps"] for r in zero.values()} == {"3"}
    result = run_script("summarize.py", RUNS, "--warmup", "3")
    assert result.returncode == 1
    assert "none after the 3 warm-up step(s)" in result.stderr
    assert "no run could be read" in result.stderr and "Traceback" not in result.stderr


def test_resumed_run_warms_up_again_in_each_segment():
    path = os.path.join(RESUMED, "qlora_bs1", "metrics.jsonl")
    assert sum(r["type"] == "header" for r in records(path)) == 2
    steps = timed_steps(path)
    assert [s["step"] for s in steps] == [2, 4]
    row = tables(run_script("summarize.py", os.path.dirname(path)).stdout)["Throughput"][0]
    assert row["Tokens/s"] == f"{sum(s['tokens'] for s in steps) / sum(s['step_seconds'] for s in steps):,.0f}"
    assert row["Timed steps"] == "2"


def _summarized_steps(path):
    """The step records summarize.py times (each segment's first is its warm-up)."""
    run = read_run(path)
    per_segment, timed = {}, []
    for segment, record in run.steps:
        per_segment[segment] = per_segment.get(segment, 0) + 1
        if per_segment[segment] > 1:
            timed.append(record)
    return run, timed


def test_steps_redone_after_a_resume_are_counted_once(tmp_path):
    # Killed after step 3 with a checkpoint at step 2: step 3 ran twice. fsdpq marks the first
    # record superseded; a file from before it did so holds both as "step" records, and the
    # resumed segment's header (resumed_from.step = 2) drops the first.
    path = os.path.join(RESUMED, "killed_after_checkpoint", "metrics.jsonl")
    kinds = [(r["type"], r.get("step")) for r in records(path) if r["type"] in ("step", "superseded")]
    assert kinds == [("step", 1), ("step", 2), ("superseded", 3), ("step", 3), ("step", 4)]
    old_style = tmp_path / "old_style" / "metrics.jsonl"
    old_style.parent.mkdir()
    with open(path) as f:
        old_style.write_text(f.read().replace('"type":"superseded"', '"type":"step"'))
    for metrics in (path, str(old_style)):
        run, timed = _summarized_steps(metrics)
        assert [r["step"] for _, r in run.steps] == [1, 2, 3, 4], metrics
        assert [r["step"] for r in timed] == [2, 4], metrics
        row = tables(run_script("summarize.py", os.path.dirname(metrics)).stdout)["Throughput"][0]
        assert row["Timed steps"] == "2", metrics
        assert row["Tokens/s"] == f"{sum(s['tokens'] for s in timed) / sum(s['step_seconds'] for s in timed):,.0f}"


@pytest.mark.parametrize("case, line, words", [
    ("empty", None, "empty metrics file"),
    ("no_header", 1, "not the header (the header line is missing)"),
    ("not_json", 6, "not JSON"),
    ("truncated", 9, "the last line is cut off mid-record"),
])
def test_damaged_file_one_line_naming_file_and_line_and_the_run_is_skipped(case, line, words):
    path = os.path.join(DAMAGED, case, "metrics.jsonl")
    if line is not None:  # the line the damage is on, from the file itself
        with open(path, "rb") as f:
            data = f.read().split(b"\n")
        assert line == {"no_header": 1, "not_json": 6, "truncated": len([d for d in data if d])}[case]
    result = run_script("summarize.py", os.path.dirname(path), os.path.join(RUNS, "cpu_tiny", "qlora_bs1_ctx256_np1"))
    assert result.returncode == 0  # another run was readable
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    where = path if line is None else f"{path}:{line}:"
    assert lines[0].startswith(f"summarize: {where}") and words in lines[0] and lines[0].endswith("run skipped")
    assert "Traceback" not in result.stderr
    assert [r["Run"] for r in tables(result.stdout)["Throughput"]] == ["qlora_bs1_ctx256_np1"]


def test_only_damaged_files_exit_non_zero_with_a_message_per_file():
    result = run_script("summarize.py", *(os.path.join(DAMAGED, c) for c in ("empty", "no_header", "not_json",
                                                                             "truncated")))
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 5 and lines[-1].startswith("summarize: error: no run could be read")
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_run_killed_between_records_is_read_and_marked_incomplete():
    result = run_script("summarize.py", os.path.join(DAMAGED, "incomplete"))
    assert result.returncode == 0 and result.stderr == ""
    row = tables(result.stdout)["Throughput"][0]
    assert row["Note"] == "incomplete" and row["Timed steps"] == "1"


def test_gpu_fields_memory_mfu_and_offload_copies():
    path = os.path.join(GPU, "llama2-7b_qlora_offload_bs4", "metrics.jsonl")
    recs = records(path)
    header, summary = recs[0], recs[-1]
    steps = timed_steps(path)
    tps = sum(s["tokens"] for s in steps) / sum(s["step_seconds"] for s in steps)
    seq = sum(s["tokens"] for s in steps) / sum(s["samples"] for s in steps)
    flops = flops_per_token({k: header["model"][k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                                            "num_attention_heads", "num_key_value_heads",
                                                            "vocab_size")}, seq,
                            int(header["config"]["lora_rank"]))
    out = tables(run_script("summarize.py", GPU).stdout)
    row = out["Throughput"][0]
    assert row["MFU"] == summarize.fmt_mfu(tps * flops / 989e12)  # H200: 989 TFLOP/s
    assert row["Peak Memory (GiB)"] == f"{summary['peak_device_reserved_bytes'] / 2 ** 30:.2f}"
    memory = out["Memory"][0]
    after_load = next(r for r in recs if r["type"] == "memory" and r["at"] == "after_load")
    assert memory["Peak allocated (GiB)"] == f"{summary['peak_device_allocated_bytes'] / 2 ** 30:.2f}"
    assert memory["Allocated after load (GiB)"] == f"{after_load['allocated_bytes'] / 2 ** 30:.2f}"
    assert memory["Reserved after load (GiB)"] == f"{after_load['reserved_bytes'] / 2 ** 30:.2f}"
    offload = sum(s["phase_seconds"]["offload_copies"] for s in steps) / len(steps)
    step = sum(s["step_seconds"] for s in steps) / len(steps)
    assert out["Step time"][0]["Offload copies"] == f"{offload * 1e3:,.1f} ({offload / step:.0%})"
    # --peak-tflops replaces the datasheet number.
    row = tables(run_script("summarize.py", GPU, "--peak-tflops", "100").stdout)["Throughput"][0]
    assert row["MFU"] == summarize.fmt_mfu(tps * flops / 100e12)


def test_section_times_table_from_the_summary(tmp_path):
    # A copy of the GPU fixture whose summary carries FSDPQ_SECTION_TIMES' section_seconds.
    run = tmp_path / "runs" / "timed"
    shutil.copytree(os.path.join(GPU, "llama2-7b_qlora_offload_bs4"), run)
    recs = records(run / "metrics.jsonl")
    assert recs[-1]["type"] == "summary"
    recs[-1]["section_seconds"] = {"linear": 3.0, "attention": 1.0, "lora bwd": 0.5, "bad": "x"}
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    out = tables(run_script("summarize.py", str(tmp_path / "runs")).stdout)
    rows = out["Where the GPU's time goes"]
    assert len(rows) == 1
    assert rows[0]["linear"] == "66.7%" and rows[0]["attention"] == "22.2%" and rows[0]["lora bwd"] == "11.1%"
    assert rows[0]["Sections (s)"] == "4.50"
    assert "bad" not in rows[0]
    # Runs without section times have no such table.
    assert "Where the GPU's time goes" not in tables(run_script("summarize.py", GPU).stdout)


def test_flop_convention_by_hand_for_the_tiny_shape():
    # tiny: hidden 64, intermediate 176, 2 layers, 4 heads (head_dim 16), 2 kv heads, vocab 32000.
    per_layer = 64 * 64 + 2 * (64 * 32) + 64 * 64 + 3 * (64 * 176)          # q, k, v, o, gate/up/down
    frozen = 2 * per_layer + 64 * 32000                                       # + lm_head
    lora = 2 * 8 * ((64 + 64) + 2 * (64 + 32) + 3 * (64 + 176))               # r 8 on q,k,v,gate,up,down
    attention = 12 * 2 * 256 * 4 * 16
    header = records(os.path.join(RUNS, "cpu_tiny", "qlora_bs1_ctx256_np1", "metrics.jsonl"))[0]
    assert summarize.run_flops_per_token(header, 256) == 4 * frozen + 6 * lora + attention
    full = dict(header, config=dict(header["config"], train_type="full"))
    assert summarize.run_flops_per_token(full, 256) == 6 * frozen + attention
    for adapters in ("hqq_lora", "bnb_dora", "hqq_dora"):  # LoRA's count (DoRA's norm is per step, not per token)
        typed = dict(header, config=dict(header["config"], train_type=adapters))
        assert summarize.run_flops_per_token(typed, 256) == 4 * frozen + 6 * lora + attention, adapters
    # Llama-Pro: the header holds the expanded model (here 2 layers, 1 of them new); the new block's
    # weights train (6 per weight), the original layer and lm_head do not (4).
    pro = dict(header, config=dict(header["config"], train_type="bnb_llama_pro", llama_pro_num_new_blocks="1"))
    assert summarize.run_flops_per_token(pro, 256) == 4 * (per_layer + 64 * 32000) + 6 * per_layer + attention


def test_plots_are_written_as_png(tmp_path):
    result = run_script("summarize.py", RUNS, "--plots", tmp_path / "plots", "--csv", tmp_path / "runs.csv")
    assert result.returncode == 0, result.stderr
    for name in ("throughput_vs_batch_size.png", "memory_vs_context_length.png", "scaling_vs_gpus.png"):
        data = (tmp_path / "plots" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name
    import pandas as pd
    df = pd.read_csv(tmp_path / "runs.csv")
    assert len(df) == 6 and {"tokens_per_second", "mfu", "compute_s"} <= set(df.columns)


def test_a_plot_without_the_variation_is_not_written_and_says_why(tmp_path):
    result = run_script("summarize.py", GPU, "--plots", tmp_path)
    assert result.returncode == 0
    assert "plot scaling_vs_gpus.png not written: no runs that differ only in GPUs" in result.stderr
    assert os.listdir(tmp_path) == []


def test_missing_path_is_an_error(tmp_path):
    result = run_script("summarize.py", tmp_path / "nothing")
    assert result.returncode == 2 and "no such file or directory" in result.stderr


def test_directory_without_runs(tmp_path):
    shutil.copy(os.path.join(FIXTURES, "tiny.ini"), tmp_path)
    result = run_script("summarize.py", tmp_path)
    assert result.returncode == 1 and "no metrics.jsonl at or below it" in result.stderr


def test_mfu_is_per_gpu_when_ranks_share_the_work():
    path = os.path.join(RUNS, "cpu_tiny", "qlora_bs1_ctx256_np2", "metrics.jsonl")
    header = records(path)[0]
    assert header["world_size"] == 2
    steps = timed_steps(path)
    tps = sum(s["tokens"] for s in steps) / sum(s["step_seconds"] for s in steps)
    flops = summarize.run_flops_per_token(header, 256)
    row = tables(run_script("summarize.py", os.path.dirname(path), "--peak-tflops", "0.001").stdout)["Throughput"][0]
    assert row["MFU"] == summarize.fmt_mfu(tps / 2 * flops / 1e9)


@pytest.mark.parametrize("edit, words", [
    (lambda h: h["model"].pop("hidden_size"), ":1: the header's model has no positive integer 'hidden_size'"),
    (lambda h: h["config"].update(batch_size="four"), ": unexpected values (ValueError"),
])
def test_header_with_bad_values_is_one_line_not_a_traceback(tmp_path, edit, words):
    source = os.path.join(RUNS, "cpu_tiny", "qlora_bs1_ctx256_np1", "metrics.jsonl")
    recs = records(source)
    edit(recs[0])
    target = tmp_path / "bad" / "metrics.jsonl"
    target.parent.mkdir()
    target.write_text("".join(json.dumps(r) + "\n" for r in recs))
    result = run_script("summarize.py", target.parent)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.splitlines()[0].startswith(f"summarize: {target}{words}"), result.stderr


def test_throughput_counts_real_tokens_not_padding(tmp_path):
    # A run whose records give real_tokens (every run since packing, docs/packing.md): the table's
    # Tokens/s is their rate, not that of the padded slots.
    def a_third_real(r):
        if r["type"] == "step":
            r["real_tokens"] = r["tokens"] // 3
        return r

    target = edited_copy(tmp_path, "padded", a_third_real)
    result = run_script("summarize.py", target.parent)
    assert result.returncode == 0, result.stderr
    row = tables(result.stdout)["Throughput"][0]
    steps = timed_steps(str(target))
    seconds = sum(s["step_seconds"] for s in steps)
    assert row["Tokens/s"] == f"{sum(s['tokens'] // 3 for s in steps) / seconds:,.0f}"
    assert row["Tokens/s"] != f"{sum(s['tokens'] for s in steps) / seconds:,.0f}"
