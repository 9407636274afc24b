"""compare.py's tables on fixture results (pytest bench/test_compare.py; no torch needed)."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402


def rec(peer, bs, tps, ctx=512, **kw):
    r = {"peer": peer, "model_shape": "llama2-7b", "context_length": ctx, "batch_size": bs,
         "gradient_checkpointing": True, "tokens_per_second": tps, "mfu": 0.25, "peak_allocated_gib": 5.0,
         "peak_reserved_gib": 6.0, "oom": False}
    r.update(kw)
    return r


def write(tmp_path, rows, extra=""):
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + extra)
    return str(path)


FIXTURE = [rec("hf_lora_eager", 1, 2000.0), rec("hf_qlora_bnb", 1, 2500.0), rec("fsdpq_qlora", 1, 5000.0),
           rec("hf_lora_eager", 2, 3000.0), rec("hf_qlora_bnb", 2, None, oom=True, tokens_per_second=None),
           rec("fsdpq_qlora", 2, 6000.0), rec("fsdpq_qlora", 4, 8000.0),
           rec("hf_lora_compile", 1, None, error="boom"), rec("hf_lora_compile", 2, None, timeout=True)]


def table_lines(text, section):
    part = text.split(f"## {section}")[1].split("## ")[0]
    return [ln for ln in part.splitlines() if ln.startswith("| llama2-7b")]


def test_every_run_rows_and_ratios(tmp_path):
    text = compare.tables(compare.load([write(tmp_path, FIXTURE)], print))
    rows = table_lines(text, "Every run")
    assert len(rows) == len(FIXTURE)
    assert any("| 1 | fsdpq_qlora | 5,000 |" in r and "2.00× (hf_qlora_bnb)" in r for r in rows)
    assert any("| 2 | fsdpq_qlora | 6,000 |" in r and "2.00× (hf_lora_eager)" in r for r in rows)
    assert any("| 2 | hf_qlora_bnb | OOM |" in r for r in rows)
    assert any("| 1 | hf_lora_compile | error |" in r for r in rows)
    assert any("| 2 | hf_lora_compile | timeout |" in r for r in rows)
    assert any("| 4 | fsdpq_qlora | 8,000 |" in r and r.endswith("| — |") for r in rows)  # no peer at bs 4
    # peers come before fsdpq within a point, points in bs order
    assert [r.split("|")[6].strip() for r in rows[:3]] == ["1"] * 3 and "fsdpq" in rows[3]  # column 6: bs
    eager = next(r for r in rows if "| 1 | hf_lora_eager |" in r)
    assert "| 2,000 | 25.0% | 5.0 | 6.0 | — |" in eager
    assert "| error | — |" in rows[0]  # no MFU without a measurement


def test_best_batch_size_table(tmp_path):
    text = compare.tables(compare.load([write(tmp_path, FIXTURE)], print))
    rows = table_lines(text, "Best batch size of each")
    assert len(rows) == 3  # eager, bnb, fsdpq; compile has no measurement
    assert any("| 4 | fsdpq_qlora | 8,000 |" in r and "2.67× (hf_lora_eager)" in r for r in rows)


def test_runs_at_another_dropout_are_their_own_rows(tmp_path):
    rows = FIXTURE[:3] + [rec("hf_lora_eager", 1, 4000.0, lora_dropout=0.0), rec("fsdpq_qlora", 1, 6000.0, lora_dropout=0.0)]
    text = compare.tables(compare.load([write(tmp_path, rows)], print))
    every = table_lines(text, "Every run")
    assert len(every) == 5  # nothing overwritten: the dropout-0 runs are other points
    # Each fsdpq row is compared with the peers at its own dropout (0.1 where none is recorded).
    assert any("| 0.1 | 1 | fsdpq_qlora | 5,000 |" in r and "2.00× (hf_qlora_bnb)" in r for r in every)
    assert any("| 0 | 1 | fsdpq_qlora | 6,000 |" in r and "1.50× (hf_lora_eager)" in r for r in every)


def test_runs_at_another_rank_are_their_own_rows(tmp_path):
    """bench.py --lora-rank: each rank is a point of its own, in both tables (64 where none is recorded)."""
    rows = FIXTURE[:3] + [rec("hf_lora_eager", 1, 2200.0, lora_rank=16), rec("fsdpq_qlora", 1, 4400.0, lora_rank=16)]
    text = compare.tables(compare.load([write(tmp_path, rows)], print))
    every = table_lines(text, "Every run")
    assert len(every) == 5
    assert any("| 64 | 0.1 | 1 | fsdpq_qlora | 5,000 |" in r and "2.00× (hf_qlora_bnb)" in r for r in every)
    assert any("| 16 | 0.1 | 1 | fsdpq_qlora | 4,400 |" in r and "2.00× (hf_lora_eager)" in r for r in every)
    best = table_lines(text, "Best batch size of each")
    assert sum("fsdpq_qlora" in r for r in best) == 2


def test_corrupt_and_incomplete_lines_are_reported_not_raised(tmp_path):
    path = write(tmp_path, FIXTURE[:2] + [{"peer": "x"}, [1, 2]], extra='{"peer": "hf_lora_eager", "model_sh')
    proc = subprocess.run([sys.executable, compare.__file__, path], capture_output=True, text=True)
    assert proc.returncode == 0
    assert "Traceback" not in proc.stderr
    assert ":5: skipped, not valid JSON (a run cut off mid-write?)" in proc.stderr
    assert ":3: skipped, no model_shape" in proc.stderr and ":4: skipped" in proc.stderr
    assert len(table_lines(proc.stdout, "Every run")) == 2


def test_later_line_wins_and_empty_input(tmp_path):
    rows = compare.load([write(tmp_path, [rec("hf_lora_eager", 1, 1.0), rec("hf_lora_eager", 1, 7.0)])], print)
    assert [r["tokens_per_second"] for r in rows] == [7.0]
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    proc = subprocess.run([sys.executable, compare.__file__, str(empty), str(tmp_path / "absent.jsonl")],
                          capture_output=True, text=True)
    assert proc.returncode == 1 and "no results" in proc.stderr and "cannot read" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_kept_dense_layers_show_beside_the_peer(tmp_path):
    rows = [rec("hf_lora_compile", 4, 16000.0), rec("fsdpq_qlora", 4, 16700.0, keep_dequantized_layers=26)]
    out = subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "compare.py"),
                          write(tmp_path, rows)], capture_output=True, text=True, check=True).stdout
    fsdpq = [ln for ln in table_lines(out, "Every run") if "fsdpq_qlora" in ln]
    assert len(fsdpq) == 1 and "fsdpq_qlora (26 kept)" in fsdpq[0] and "1.04× (hf_lora_compile)" in fsdpq[0]


def test_layers_not_recomputed_show_beside_the_peer(tmp_path):
    rows = [rec("hf_lora_compile", 8, 11500.0),
            rec("fsdpq_qlora", 8, 12800.0, keep_dequantized_layers=2, keep_activation_layers=3)]
    out = subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "compare.py"),
                          write(tmp_path, rows)], capture_output=True, text=True, check=True).stdout
    fsdpq = [ln for ln in table_lines(out, "Every run") if "fsdpq_qlora" in ln]
    assert len(fsdpq) == 1 and "fsdpq_qlora (2 kept, last 3 not recomputed)" in fsdpq[0], out


def test_fsdpq_variants_at_one_point_are_rows_of_their_own(tmp_path):
    """Runs with other --fsdpq-args (bench.py records them) do not replace each other: each is a row
    labelled with its settings, in both tables, against the same peer."""
    rows = [rec("hf_lora_compile", 8, 11500.0),
            rec("fsdpq_qlora", 8, 13300.0, keep_dequantized_layers=1, keep_activation_layers=4),
            rec("fsdpq_qlora", 8, 14000.0, keep_dequantized_layers=2, keep_activation_layers=8,
                fsdpq_args="--use_activation_cpu_offload true"),
            rec("fsdpq_qlora", 8, 13000.0, fsdpq_args="--use_cpu_offload  true --foo 3"),
            rec("fsdpq_qlora", 8, 12500.0, fsdpq_env="FSDPQ_ATTENTION=cudnn-nondeterministic FSDPQ_X=1")]
    out = subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "compare.py"),
                          write(tmp_path, rows)], capture_output=True, text=True, check=True).stdout
    for section in ("Every run", "Best batch size of each"):
        fsdpq = [ln for ln in table_lines(out, section) if "fsdpq_qlora" in ln]
        assert len(fsdpq) == 4, out
        assert any("fsdpq_qlora (1 kept, last 4 not recomputed)" in ln and "1.16×" in ln for ln in fsdpq), out
        assert any("fsdpq_qlora (act offload, 2 kept, last 8 not recomputed)" in ln and "1.22×" in ln for ln in fsdpq)
        assert any("fsdpq_qlora (cpu offload --foo 3)" in ln for ln in fsdpq), out
        assert any("fsdpq_qlora (non-deterministic attention FSDPQ_X=1)" in ln for ln in fsdpq), out
