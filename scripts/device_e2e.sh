#!/usr/bin/env bash
# Issue #5's end-to-end matrix on one GPU: preset:llama2-7b QLoRA on the real sql data (random
# weights, so the loss falls from ~ln(32000) as the adapters learn the data's token statistics)
# with every precision, checkpointing on/off and CPU offload on/off. Prepare here:
#   make build; mkdir -p .device/data; cp ../shared/data/{sql.jsonl,tokenizer.model} .device/data/
#   ../shared/device/bundle-libs.sh build/fsdpq .device/lib
# Run there with carry [".device", "build/fsdpq"]: bash scripts/device_e2e.sh   (STEPS=20, LR=1e-4 by default)
export LD_LIBRARY_PATH=$PWD/.device/lib:$LD_LIBRARY_PATH
B=$PWD/build/fsdpq; W=$(mktemp -d); STEPS=${STEPS:-20}; LR=${LR:-1e-4}
run() {  # name, flags
  local name=$1; shift
  timeout 150 $B --model_name preset:llama2-7b --tokenizer_path .device/data/tokenizer.model --train_type qlora \
    --dataset sql --data_path .device/data/sql.jsonl --context_length 512 --batch_size 4 --max_steps $STEPS \
    --lr $LR --log_to stdout --output_dir $W/$name "$@" > $OUT/$name.log 2>&1
  echo "$name rc=$?"
  cp $W/$name/metrics.jsonl $OUT/$name.metrics.jsonl 2>/dev/null
}
for p in bf16 fp32 bf16_autocast bf16_buffers_autocast fp16_autocast; do run "$p" --precision $p; done
run bf16_no_ckpt --use_gradient_checkpointing false
run bf16_offload --use_cpu_offload true
run bf16_no_ckpt_offload --use_gradient_checkpointing false --use_cpu_offload true
python3 - $OUT <<'PY'
import glob, json, os, sys
print(f"{'run':24} {'first':>7} {'last':>7} {'tok/s':>7} {'peak GiB':>8}")
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.metrics.jsonl"))):
    rows = [json.loads(l) for l in open(path)]
    steps = [r for r in rows if r["type"] == "step"]
    summary = next((r for r in rows if r["type"] == "summary"), {})
    if not steps:
        print(os.path.basename(path), "no steps"); continue
    tps = sum(s["tokens"] for s in steps[1:]) / max(sum(s["step_seconds"] for s in steps[1:]), 1e-9)
    first = sum(s["loss"] for s in steps[:3]) / len(steps[:3]); last = sum(s["loss"] for s in steps[-3:]) / len(steps[-3:])
    peak = summary.get("peak_device_allocated_bytes", 0) / 2**30
    print(f"{os.path.basename(path)[:-14]:24} {first:7.3f} {last:7.3f} {tps:7.0f} {peak:8.2f}")
PY
