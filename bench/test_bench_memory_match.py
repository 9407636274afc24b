"""bench.py's --fsdpq-memory-of: the kept dense layers chosen from `fsdpq plan` (pytest; needs the
fsdpq binary in $FSDPQ, as ctest's python test gives it; no GPU, no torch)."""
import argparse
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402

FSDPQ = os.environ.get("FSDPQ", "")
LORA = bench.Lora(64, 0.1)  # fsdp_qlora's rank and dropout
needs_fsdpq = pytest.mark.skipif(not os.path.exists(FSDPQ), reason="set FSDPQ to the fsdpq binary")


@needs_fsdpq
def test_the_most_kept_layers_under_the_cap():
    args = ("llama2-7b", 512, 4, False, LORA)
    none = bench.plan_peak_gib(FSDPQ, *args, 0)
    four = bench.plan_peak_gib(FSDPQ, *args, 4)
    assert four > none  # each kept layer costs memory
    per_layer = (four - none) / 4
    cap = none + 10.5 * per_layer
    keep = bench.kept_layers_under(FSDPQ, *args, cap)
    assert keep == 10
    assert bench.plan_peak_gib(FSDPQ, *args, keep) <= cap < bench.plan_peak_gib(FSDPQ, *args, keep + 1)
    assert bench.kept_layers_under(FSDPQ, *args, 1000.0) == 32  # all of them
    assert bench.kept_layers_under(FSDPQ, *args, none - 0.5) is None  # not even none fits


@needs_fsdpq
def test_memory_matched_args_follow_the_peers_measured_peak():
    class A:
        fsdpq, fsdpq_memory_of, lora_dropout, lora_rank, fsdpq_args = FSDPQ, "hf_lora_compile", 0.1, 64, ""
    point = ("llama2-7b", 512, 4, False)
    three = bench.plan_peak_gib(FSDPQ, *point, LORA, 3)
    # The plan must fit under the peer's peak less the margin (a kept layer here is ~0.45 GiB, the
    # 1% margin ~0.2): just above the plan's peak at 3 gives 2, just above it over the margin 3.
    done = {("hf_lora_compile", *point, 0.1, 64): {"peak_allocated_gib": three + 0.01}}
    assert bench.memory_matched_args(A, done, *point) == ["--keep_dequantized_layers", "2"]
    done = {("hf_lora_compile", *point, 0.1, 64): {"peak_allocated_gib": three / bench.PLAN_MARGIN + 0.01}}
    assert bench.memory_matched_args(A, done, *point) == ["--keep_dequantized_layers", "3"]
    assert bench.memory_matched_args(A, {}, *point) is None  # the peer has no measurement there
    oom = {("hf_lora_compile", *point, 0.1, 64): {"oom": True, "peak_allocated_gib": None}}
    assert bench.memory_matched_args(A, oom, *point) is None


@needs_fsdpq
def test_with_checkpointing_the_last_layers_are_not_recomputed_first():
    """At a checkpointing point the memory goes first to layers not recomputed (each saves a forward),
    and what is left to dense layers."""
    class A:
        fsdpq, fsdpq_memory_of, lora_dropout, lora_rank, fsdpq_args = FSDPQ, "hf_lora_compile", 0.1, 64, ""
    point = ("llama2-7b", 512, 4, True)
    three = bench.plan_peak_gib(FSDPQ, *point, LORA, 0, 3)
    done = {("hf_lora_compile", *point, 0.1, 64): {"peak_allocated_gib": three / bench.PLAN_MARGIN + 0.01}}
    args = bench.memory_matched_args(A, done, *point)
    assert args[args.index("--keep_activation_layers") + 1] == "3"
    keep = int(args[args.index("--keep_dequantized_layers") + 1])
    assert bench.plan_peak_gib(FSDPQ, *point, LORA, keep, 3) <= three / bench.PLAN_MARGIN + 0.01


@needs_fsdpq
def test_the_runs_own_settings_are_planned_with_it():
    """--fsdpq-args reach the plan too: with the checkpointed layer inputs offloaded to the host the
    same peak leaves more of the last layers unrecomputed."""
    class A:
        fsdpq, fsdpq_memory_of, lora_dropout, lora_rank, fsdpq_args = FSDPQ, "hf_lora_compile", 0.1, 64, ""
    point = ("llama2-7b", 2048, 8, True)
    cap = bench.plan_peak_gib(FSDPQ, *point, LORA, 0, 3) / bench.PLAN_MARGIN + 0.01
    done = {("hf_lora_compile", *point, 0.1, 64): {"peak_allocated_gib": cap}}
    plain = bench.memory_matched_args(A, done, *point)
    A.fsdpq_args = "--use_activation_cpu_offload true"
    offloaded = bench.memory_matched_args(A, done, *point)
    layers = lambda args: int(args[args.index("--keep_activation_layers") + 1])  # noqa: E731
    assert layers(plain) == 3
    assert layers(offloaded) > layers(plain)
    assert bench.plan_peak_gib(FSDPQ, *point, LORA, 0, layers(offloaded), ["--use_activation_cpu_offload", "true"]) <= cap


def test_fsdpq_entries_are_both_unless_peers_names_one():
    assert bench.grid_peers("hf_lora_compile", None) == ["hf_lora_compile"]
    assert bench.grid_peers("hf_lora_compile", "fsdpq") == ["hf_lora_compile", "fsdpq_lora", "fsdpq_qlora"]
    assert bench.grid_peers("hf_lora_compile,fsdpq_qlora", "fsdpq") == ["hf_lora_compile", "fsdpq_qlora"]
    assert bench.grid_peers("fsdpq_lora,", "fsdpq") == ["fsdpq_lora"]


def test_every_peer_runs_the_grids_rank_and_dropout(tmp_path):
    """--lora-rank and --lora-dropout reach the HF peers' and fsdpq's command lines alike."""
    a = argparse.Namespace(
        warmup=1, steps=2, device="cuda", peak_tflops=989.0, lora_rank=16, lora_dropout=0.05, peer_args="",
        fsdpq="fsdpq", fsdpq_args="")
    peer, _ = bench.peer_command(a, "hf_lora_compile", "llama2-7b", 512, 4, False, str(tmp_path))
    assert peer[peer.index("--lora-r") + 1] == "16" and peer[peer.index("--lora-dropout") + 1] == "0.05"
    ours, _ = bench.fsdpq_command(a, "fsdpq_qlora", "llama2-7b", 512, 4, False, str(tmp_path))
    assert ours[ours.index("--lora_rank") + 1] == "16" and ours[ours.index("--lora_dropout") + 1] == "0.05"
    # a record from before bench.py wrote lora_rank ran at 64
    assert bench.key({"peer": "p", "lora_dropout": 0.1})[-1] == 64


@needs_fsdpq
def test_the_plan_counts_the_grids_rank():
    point = ("llama2-7b", 512, 4, False)
    assert bench.plan_peak_gib(FSDPQ, *point, bench.Lora(16, 0.1), 0) < bench.plan_peak_gib(FSDPQ, *point, LORA, 0)


def test_fsdpq_env_words_and_the_recorded_environment(monkeypatch):
    """--fsdpq-env's words become settings (a word of another form is refused, naming it), and a
    record names every FSDPQ_* variable fsdpq inherits, sorted, and no other."""
    assert bench.fsdpq_env_settings("FSDPQ_ATTENTION=cudnn-nondeterministic FSDPQ_X=") == {
        "FSDPQ_ATTENTION": "cudnn-nondeterministic", "FSDPQ_X": ""}
    with pytest.raises(ValueError, match="'ATTENTION=cudnn'"):
        bench.fsdpq_env_settings("FSDPQ_A=1 ATTENTION=cudnn")
    with pytest.raises(ValueError, match="FSDPQ_NAME=value"):
        bench.fsdpq_env_settings("FSDPQ_ATTENTION")
    for k in [k for k in os.environ if k.startswith("FSDPQ_")]:
        monkeypatch.delenv(k)
    assert bench.fsdpq_environment() == ""
    monkeypatch.setenv("FSDPQ_LORA_FOLD", "1")
    monkeypatch.setenv("FSDPQ_ATTENTION", "wgmma")
    monkeypatch.setenv("OTHER_SETTING", "x")
    assert bench.fsdpq_environment() == "FSDPQ_ATTENTION=wgmma FSDPQ_LORA_FOLD=1"


def test_a_bad_fsdpq_env_stops_the_grid_before_any_run(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--peers", "hf_lora_eager", "--fsdpq-env", "ATTENTION=cudnn", "--results", "/nonexistent/r.jsonl"])
    assert "FSDPQ_NAME=value" in capsys.readouterr().err
