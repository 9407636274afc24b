#!/usr/bin/env bash
# One device call: the CPU-offload engine on Llama-2-7B shapes (throughput, memory, and that clipping,
# the scheduler and fp16 loss scaling leave the losses unchanged and cost little), and the
# multi-rank tests (sharding equivalence at 1/2/4 ranks, checkpoints resumed at other world
# sizes) with every rank on the one GPU (FSDPQ_SHARE_GPUS=1: the engine's GPU-memory collectives
# over MPI staged through the host, the code path NCCL runs with one GPU per rank). Prepare here:
#   make build; ../shared/device/bundle-libs.sh build/fsdpq build/tests/fsdpq_unit_tests .device/lib
#   ./fsdpq demo --out .device/demo --dry_run
# Run there with carry [".device/lib", ".device/demo", "build/fsdpq", "build/tests/fsdpq_unit_tests"]:
#   bash scripts/device_offload_ranks.sh        (SKIP=offload,ranks and RUNS=c512,c512_offload narrow it)
export LD_LIBRARY_PATH=$PWD/.device/lib:$LD_LIBRARY_PATH OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
B=$PWD/build/fsdpq; W=$(mktemp -d)
skip() { [[ ",${SKIP:-}," == *",$1,"* ]]; }
run7b() {  # name, flags (RUNS="a,b" runs only those)
  local name=$1; shift
  [ -n "${RUNS:-}" ] && [[ ",$RUNS," != *",$name,"* ]] && return
  timeout 150 $B --model_name preset:llama2-7b --tokenizer_path builtin:bytes --train_type qlora --dataset dummy \
    --dataset_samples 48 --pad_to_context_length true --batch_size 4 --max_steps 8 --lora_rank 64 --lora_alpha 16 \
    --lora_dropout 0.1 --lr 1e-4 --log_to stdout --output_dir $W/$name "$@" > $OUT/$name.log 2>&1
  echo "$name rc=$?"; grep -E "error" $OUT/$name.log | head -3
  cp $W/$name/metrics.jsonl $OUT/$name.metrics.jsonl 2>/dev/null
}
if ! skip offload; then
  echo "== preset:llama2-7b qlora r64 bs 4, 8 steps: offload off/on, with clipping + cosine schedule, fp16"
  run7b c512 --context_length 512
  run7b c512_offload --context_length 512 --use_cpu_offload true
  run7b c512_clip --context_length 512 --apply_gradient_clipping true --lr_scheduler cosine
  run7b c512_offload_clip --context_length 512 --use_cpu_offload true --apply_gradient_clipping true --lr_scheduler cosine
  run7b c512_fp16 --context_length 512 --precision fp16_autocast
  run7b c512_offload_fp16 --context_length 512 --use_cpu_offload true --precision fp16_autocast
  run7b c2048_offload --context_length 2048 --use_cpu_offload true
  run7b c2048_offload_clip --context_length 2048 --use_cpu_offload true --apply_gradient_clipping true --lr_scheduler cosine
  python3 - $OUT <<'PY'
import json, os, sys
out = sys.argv[1]
def load(name):
    try:
        rows = [json.loads(l) for l in open(os.path.join(out, name + ".metrics.jsonl"))]
    except OSError:
        return None
    return [r for r in rows if r["type"] == "step"], next((r for r in rows if r["type"] == "summary"), {})
names = ["c512", "c512_offload", "c512_clip", "c512_offload_clip", "c512_fp16", "c512_offload_fp16", "c2048_offload",
         "c2048_offload_clip"]
runs = {n: load(n) for n in names}
print(f"{'run':20} {'tok/s':>7} {'s/step':>7} {'peak GiB':>8}  phases (mean s, steps 2..)")
for n, r in runs.items():
    if not r:
        print(n, "no metrics"); continue
    steps, summary = r
    timed = steps[1:]
    sec = sum(s["step_seconds"] for s in timed) / len(timed)
    tps = sum(s["tokens"] for s in timed) / sum(s["step_seconds"] for s in timed)
    phases = {k: round(sum(s["phase_seconds"][k] for s in timed) / len(timed), 4) for k in timed[0]["phase_seconds"]}
    print(f"{n:20} {tps:7.0f} {sec:7.4f} {summary.get('peak_device_allocated_bytes', 0) / 2**30:8.2f}  {json.dumps(phases)}")
for a, b in [("c512", "c512_offload"), ("c512_clip", "c512_offload_clip"), ("c512_fp16", "c512_offload_fp16")]:
    if runs[a] and runs[b]:
        la = [s["loss"] for s in runs[a][0]]; lb = [s["loss"] for s in runs[b][0]]
        print(f"{a} vs {b}: losses {'identical' if la == lb else 'differ by up to %.3g' % max(abs(x - y) for x, y in zip(la, lb))}")
for a, b in [("c512_offload", "c512_offload_clip"), ("c2048_offload", "c2048_offload_clip")]:
    if runs[a] and runs[b]:
        sa = sum(s["step_seconds"] for s in runs[a][0][1:]); sb = sum(s["step_seconds"] for s in runs[b][0][1:])
        print(f"clipping + cosine schedule with offload ({b}): {100 * (sb / sa - 1):+.1f}% step time")
PY
fi
if ! skip ranks; then
  echo "== multi-rank tests with the ranks sharing the GPU (FSDPQ_SHARE_GPUS=1): equivalence, checkpoints"
  [ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }  # the test binary's built-in paths
  FSDPQ_SHARE_GPUS=1 timeout 330 build/tests/fsdpq_unit_tests \
    --gtest_filter='*Equivalence*:Checkpoints.*:FsdpTrain.Profile*' > $OUT/ranks_tests.log 2>&1
  echo "rc=$?"
  grep -E "^\[ +(OK|FAILED) +\]|Failure|max relative difference" $OUT/ranks_tests.log | head -60
fi
