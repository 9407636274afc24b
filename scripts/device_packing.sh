#!/usr/bin/env bash
# One device call for issue #26 (docs/packing.md): the segment attention kernels and RoPE positions
# against the CPU, every attention GPU test (the SIMT kernels changed) and the model, then the
# reference job — inputs/sql.ini's settings (QLoRA r 64, α 16, dropout 0.1, ctx 512, checkpointing)
# on preset:llama2-7b — unpacked and packed at several batch sizes, with real tokens/s (padding is
# not work) from the step records, and beside it the peer users have today: HF + PEFT + bitsandbytes
# QLoRA (bench/peer_train.py hf_qlora_bnb) on the same examples in the same order (`fsdpq examples`
# with the job's settings), batch 8 padded to each batch's longest example as fsdp_qlora pads, with
# checkpointing (sql.ini's) and without. Prepare here:
#   make build && mkdir -p .device/data && cp ../shared/data/sql.jsonl ../shared/data/tokenizer.model .device/data/
#   ../shared/device/bundle-libs.sh build/fsdpq build/tests/fsdpq_gpu_tests .device/lib
#   bench/fetch_peer_wheels.sh   (bitsandbytes' wheel into .device/wheels: the GPU machine has none)
# Run there with carry [".device", "build/fsdpq", "build/tests/fsdpq_gpu_tests"] (or scripts/device_pack.sh
# build/fsdpq build/tests/fsdpq_gpu_tests .device/lib .device/wheels .device/data):
#   bash scripts/device_packing.sh   (SKIP=tests,perf,job,peer narrows it; MODEL, POINTS="unpacked:8 free:8 packed:8 fixed:8"
#                                     as mode:batch_size, fixed being random full rows, free unpacked with
#                                     padding_free; STEPS; FSDPQ=, TESTS=, DATA=,
#                                     WHEELS= other paths)
B=${FSDPQ:-$PWD/build/fsdpq}; T=${TESTS:-$PWD/build/tests/fsdpq_gpu_tests}; DATA=${DATA:-$PWD/.device/data}
WHEELS=${WHEELS:-$PWD/.device/wheels}; MODEL=${MODEL:-preset:llama2-7b}; STEPS=${STEPS:-12}
W=$(mktemp -d); OUT=${OUT:-$W}
skip() { [[ ",${SKIP:-}," == *",$1,"* ]]; }
export LD_LIBRARY_PATH=$PWD/.device/lib:${LD_LIBRARY_PATH:-}
# The job's settings, shared by fsdpq's points and the peer's examples (batch size, packing per point).
SETTINGS=(--model_name "$MODEL" --tokenizer_path "$DATA/tokenizer.model" --train_type qlora --precision bf16
          --lora_rank 64 --lora_alpha 16 --lora_dropout 0.1 --context_length 512 --lr 1e-4 --seed 42
          --use_gradient_checkpointing true)
JOB=("${SETTINGS[@]}" --dataset sql --data_path "$DATA/sql.jsonl")

if ! skip tests; then
  echo "== segment attention, RoPE positions, every attention test, the model"
  timeout 300 "$T" --gtest_filter='GpuOpsAttentionSegments.*:GpuOpsRope*:GpuOpsAttention*:GpuModel.*:-*Perf' \
    > "$OUT/tests.log" 2>&1
  echo "rc=$?"; grep -E "^\[ +(FAILED|SKIPPED) +\]|^\[  (PASSED|FAILED)  \]|Failure|Expected|Which is" "$OUT/tests.log" | head -20
fi

if ! skip perf; then
  echo "== packed rows' attention cost against plain causal (T 512, ~80-token examples), per route"
  FSDPQ_GPU_PERF=1 timeout 120 "$T" --gtest_filter='GpuOpsAttentionSegments.Perf' 2>&1 | grep PERF
fi

if ! skip job; then
  echo "== the reference job, unpacked and packed ($MODEL)"
  # fixed: the same settings on rows of context_length random tokens, every slot a token: the
  # fixed-length throughput at the same tokens per step that issue #26's target compares with.
  for point in ${POINTS:-unpacked:8 free:8 unpacked:16 unpacked:32 packed:2 packed:4 packed:8 fixed:8}; do
    mode=${point%:*}; bs=${point#*:}; name=${mode}_bs$bs
    packing=false; [ "$mode" = packed ] && packing=true
    args=("${JOB[@]}")
    free=false; [ "$mode" = free ] && free=true  # unpacked batches, their examples in one row (sql.ini's)
    args+=(--padding_free $free)
    [ "$mode" = fixed ] && args=("${SETTINGS[@]}" --dataset dummy --pad_to_context_length true
                                 --dataset_samples $((bs * (STEPS + 2))))
    timeout 300 "$B" "${args[@]}" --batch_size "$bs" --packing $packing --max_steps "$STEPS" --log_to stdout \
      --output_dir "$W/$name" > "$OUT/$name.log" 2>&1
    echo "$name rc=$? $(date +%T)"; grep -E "error|packing efficiency" "$OUT/$name.log" | head -2
    cp "$W/$name/metrics.jsonl" "$OUT/$name.metrics.jsonl" 2>/dev/null
  done
fi

if ! skip peer; then
  echo "== HF + PEFT + bitsandbytes QLoRA on the job's examples, batch 8 padded per batch ($MODEL)"
  # The examples the unpacked batch-8 run trains on, in its order; the peer's first STEPS batches are
  # that run's first STEPS steps, and both time all but the first two.
  timeout 120 "$B" examples "${JOB[@]}" --batch_size 8 --out "$W/sql_examples.jsonl" > "$OUT/examples.log" 2>&1
  echo "examples rc=$?"; tail -1 "$OUT/examples.log"
  # bitsandbytes from the carried wheel, into a private folder (the image has torch, transformers, peft).
  PY=$(mktemp -d); wheel=$(ls "$WHEELS"/bitsandbytes-*.whl 2>/dev/null | tail -1)
  [ -n "$wheel" ] || echo "no bitsandbytes wheel in $WHEELS: run bench/fetch_peer_wheels.sh here and carry it"
  python3 -m pip install -q --no-deps --no-index --target "$PY" "$wheel" > "$OUT/pip.log" 2>&1
  echo "pip rc=$? (${wheel##*/})"
  if [[ $MODEL == preset:* ]]; then model=(--shape "${MODEL#preset:}"); else model=(--model "$MODEL"); fi
  for ckpt in grad-ckpt no-grad-ckpt; do
    PYTHONPATH=$PY${PYTHONPATH:+:$PYTHONPATH} timeout 300 python3 bench/peer_train.py --peer hf_qlora_bnb \
      "${model[@]}" --examples "$W/sql_examples.jsonl" --batch-size 8 --context-length 512 --warmup 2 \
      --steps $((STEPS - 2)) --lr 1e-4 --seed 42 --$ckpt > "$OUT/peer_$ckpt.json" 2> "$OUT/peer_$ckpt.log"
    echo "peer $ckpt rc=$? $(date +%T)"; grep -o '"error": .*' "$OUT/peer_$ckpt.json" | tr -d '\n' | head -c 400; echo
  done
fi

python3 - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
print("\n| run | rows/batch | tokens/s (slots) | real tokens/s | real tokens/step | packing efficiency | peak allocated GiB |")
print("|---|---|---|---|---|---|---|")
for path in sorted(glob.glob(f"{out}/*.metrics.jsonl")):
    rows = [json.loads(l) for l in open(path)]
    steps = [r for r in rows if r.get("type") == "step"][2:]  # the first two warm up
    summary = next((r for r in rows if r.get("type") == "summary"), {})
    if not steps:
        print(f"| {os.path.basename(path)} | too few steps |"); continue
    secs = sum(s["step_seconds"] for s in steps)
    tokens, real = sum(s["tokens"] for s in steps), sum(s.get("real_tokens", 0) for s in steps)
    name = os.path.basename(path).split(".")[0]
    print(f"| {name} | {name.split('_bs')[1]} | {tokens / secs:,.0f} | {real / secs:,.0f} | {real / len(steps):,.0f} | "
          f"{real / tokens:.1%} | {summary.get('peak_device_allocated_bytes', 0) / 2**30:.2f} |")
# Issue #26's targets: the best packed point's real tokens/s against the fixed-length point and the
# unpacked batch-8 job.
def real_rate(name):
    try:
        rows = [json.loads(l) for l in open(f"{out}/{name}.metrics.jsonl")]
    except OSError:
        return None
    steps = [r for r in rows if r.get("type") == "step"][2:]
    secs = sum(s["step_seconds"] for s in steps)
    return sum(s.get("real_tokens", 0) for s in steps) / secs if steps and secs else None
packed = [(real_rate(os.path.basename(p).split(".")[0]), p) for p in glob.glob(f"{out}/packed_bs*.metrics.jsonl")]
packed = max((r for r in packed if r[0]), default=None)
fixed, unpacked8 = real_rate("fixed_bs8"), real_rate("unpacked_bs8")
if packed and fixed and unpacked8:
    print(f"\nbest packed ({os.path.basename(packed[1]).split('.')[0]}): {packed[0] / fixed:.1%} of fixed-length bs 8 "
          f"(target >= 90%), {packed[0] / unpacked8:.2f}x the unpacked bs 8 job (target >= 2x)")
# The peer's JSON line (bench/peer_train.py --examples): tokens and real_tokens over its timed steps.
for path in sorted(glob.glob(f"{out}/peer_*.json")):
    name = "hf_qlora_bnb " + ("no ckpt" if "no-grad" in path else "ckpt")
    try:
        r = json.loads(open(path).read().strip().splitlines()[-1])
    except (IndexError, ValueError):
        print(f"| {name} | no JSON line |"); continue
    if not r.get("real_tokens_per_second"):
        print(f"| {name} | {r.get('batch_size', '')} | {'out of memory' if r.get('oom') else r.get('error', 'no result')[:80]} |")
        continue
    print(f"| {name} | {r['batch_size']} | {r['tokens_per_second']:,.0f} | {r['real_tokens_per_second']:,.0f} | "
          f"{r['real_tokens'] / r['steps_timed']:,.0f} | {r['real_tokens'] / r['tokens']:.1%} | "
          f"{r.get('peak_allocated_gib') or 0:.2f} |")
PY
