#!/usr/bin/env bash
# One device call for issue #26 (docs/packing.md): the segment attention kernels and RoPE positions
# against the CPU, every attention GPU test (the SIMT kernels changed) and the model, then the
# reference job — inputs/sql.ini's settings (QLoRA r 64, α 16, dropout 0.1, ctx 512, checkpointing)
# on preset:llama2-7b — unpacked and packed at several batch sizes, with real tokens/s (padding is
# not work) from the step records. Prepare here:
#   make build && mkdir -p .device/data && cp ../shared/data/sql.jsonl ../shared/data/tokenizer.model .device/data/
#   ../shared/device/bundle-libs.sh build/fsdpq build/tests/fsdpq_gpu_tests .device/lib
# Run there with carry [".device", "build/fsdpq", "build/tests/fsdpq_gpu_tests"] (or scripts/device_pack.sh):
#   bash scripts/device_packing.sh   (SKIP=tests,job narrows it; MODEL, POINTS="unpacked:8 packed:8" as
#                                     mode:batch_size, STEPS; FSDPQ=, TESTS=, DATA= other paths)
B=${FSDPQ:-$PWD/build/fsdpq}; T=${TESTS:-$PWD/build/tests/fsdpq_gpu_tests}; DATA=${DATA:-$PWD/.device/data}
W=$(mktemp -d); OUT=${OUT:-$W}
skip() { [[ ",${SKIP:-}," == *",$1,"* ]]; }
export LD_LIBRARY_PATH=$PWD/.device/lib:${LD_LIBRARY_PATH:-}

if ! skip tests; then
  echo "== segment attention, RoPE positions, every attention test, the model"
  timeout 300 "$T" --gtest_filter='GpuOpsAttentionSegments.*:GpuOpsRope*:GpuOpsAttention*:GpuModel.*:-*Perf' \
    > "$OUT/tests.log" 2>&1
  echo "rc=$?"; grep -E "^\[ +(FAILED|SKIPPED) +\]|^\[  (PASSED|FAILED)  \]|Failure|Expected|Which is" "$OUT/tests.log" | head -20
fi

if ! skip job; then
  echo "== the reference job, unpacked and packed (${MODEL:-preset:llama2-7b})"
  for point in ${POINTS:-unpacked:8 unpacked:16 unpacked:32 packed:2 packed:4 packed:8}; do
    mode=${point%:*}; bs=${point#*:}; name=${mode}_bs$bs
    packing=false; [ "$mode" = packed ] && packing=true
    timeout 300 "$B" --model_name "${MODEL:-preset:llama2-7b}" --tokenizer_path "$DATA/tokenizer.model" \
      --train_type qlora --precision bf16 --lora_rank 64 --lora_alpha 16 --lora_dropout 0.1 --dataset sql \
      --data_path "$DATA/sql.jsonl" --context_length 512 --batch_size "$bs" --lr 1e-4 --seed 42 \
      --use_gradient_checkpointing true --packing $packing --max_steps "${STEPS:-12}" --log_to stdout \
      --output_dir "$W/$name" > "$OUT/$name.log" 2>&1
    echo "$name rc=$? $(date +%T)"; grep -E "error|packing efficiency" "$OUT/$name.log" | head -2
    cp "$W/$name/metrics.jsonl" "$OUT/$name.metrics.jsonl" 2>/dev/null
  done
  python3 - "$OUT" <<'PY'
import glob, json, os, sys
print("\n| run | rows/batch | tokens/s (slots) | real tokens/s | real tokens/step | packing efficiency | peak allocated GiB |")
print("|---|---|---|---|---|---|---|")
for path in sorted(glob.glob(f"{sys.argv[1]}/*.metrics.jsonl")):
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
PY
fi
