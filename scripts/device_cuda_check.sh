#!/usr/bin/env bash
# One device call for the CUDA backend (see ../shared/device/README.md): the GPU test binary (op
# parity, NF4, optimizers, whole model), its perf mode, the CLI training on the GPU against the CPU
# backend, and a Llama-2-7B-shape QLoRA run. Prepare here:
#   make build && ./fsdpq demo --out .device/demo --dry_run
#   ../shared/device/bundle-libs.sh build/fsdpq build/tests/fsdpq_gpu_tests .device/lib
# Run there with carry [".device", "build/tests/fsdpq_gpu_tests", "build/fsdpq"]:
#   bash scripts/device_cuda_check.sh          (GPU_FILTER / PERF_FILTER / SKIP=tests,perf,cli,mma,hf,7b narrow it)
export LD_LIBRARY_PATH=$PWD/.device/lib:$LD_LIBRARY_PATH OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
B=$PWD/build/fsdpq; T=$PWD/build/tests/fsdpq_gpu_tests; D=$PWD/.device/demo; W=$(mktemp -d)
skip() { [[ ",${SKIP:-}," == *",$1,"* ]]; }
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
if ! skip tests; then
  echo "== gpu tests"; timeout 300 "$T" --gtest_filter="${GPU_FILTER:-*}" > $OUT/gpu_tests.log 2>&1; echo "rc=$?"
  grep -E "^\[ +(OK|FAILED) +\]|Failure|error:|Expected|Which is|normalized|loss cpu" $OUT/gpu_tests.log | head -80
fi
if ! skip perf; then
  echo "== perf"; FSDPQ_GPU_PERF=1 timeout 150 "$T" --gtest_filter="${PERF_FILTER:-GpuOps*:GpuNf4*:GpuOptim*}" 2>&1 | grep PERF
fi
if ! skip cli; then
  echo "== demo model: 12 steps on the GPU and on the CPU backend"
  args=(--model_name $D/model --dataset alpaca --data_path $D/data.jsonl --dataset_samples 64 --batch_size 4
        --context_length 128 --train_type qlora --lora_rank 8 --lora_alpha 16 --lora_dropout 0 --lr 2e-3
        --max_steps 12 --log_to stdout)
  timeout 120 $B "${args[@]}" --output_dir $W/gpu > $OUT/demo_gpu.log 2>&1; echo "gpu rc=$?"
  CUDA_VISIBLE_DEVICES= timeout 120 $B "${args[@]}" --output_dir $W/cpu > $OUT/demo_cpu.log 2>&1; echo "cpu rc=$?"
  python3 - $W <<'PY'
import json, sys
for dev in ("gpu", "cpu"):
    try:
        rows = [json.loads(l) for l in open(f"{sys.argv[1]}/{dev}/metrics.jsonl")]
    except OSError as e:
        print(dev, "no metrics:", e); continue
    print(dev, " ".join(f"{r['loss']:.4f}" for r in rows if r.get("type") == "step"))
PY
  grep -E "GPU|error" $OUT/demo_gpu.log | head -5
fi
if ! skip mma; then
  echo "== tensor-core attention (opt-in FSDPQ_ATTENTION=mma): parity, perf, whole model"
  timeout 150 "$T" --gtest_filter='GpuOpsAttentionMma.*' > $OUT/mma_tests.log 2>&1; echo "rc=$?"
  grep -E "^\[ +(OK|FAILED) +\]|Failure|normalized" $OUT/mma_tests.log | head -30
  FSDPQ_GPU_PERF=1 timeout 120 "$T" --gtest_filter='GpuOpsAttentionMma.Perf:GpuOpsAttention.Perf' 2>&1 | grep PERF
  FSDPQ_ATTENTION=mma timeout 60 "$T" --gtest_filter='GpuModel.*' 2>&1 | grep -E "loss cpu|OK|FAILED"
fi
if ! skip hf; then
  echo "== HF + PEFT (+ bitsandbytes) training parity of the GPU pass (tests/reference/hf_train_parity.py)"
  python3 -m pip install -q --no-deps --target /tmp/bnb-site .device/wheels/bitsandbytes-*.whl > /dev/null 2>&1
  for p in fp32 bf16; do
    PYTHONPATH=/tmp/bnb-site timeout 150 python3 tests/reference/hf_train_parity.py --fsdpq $B --gpu-tests "$T" \
      --dir $W/hf_$p --precision $p > $OUT/hf_parity_$p.log 2>&1; echo "$p rc=$?"
    grep -E "loss hf|MISMATCH|Error" $OUT/hf_parity_$p.log | head -8
  done
fi
if ! skip 7b; then
  echo "== preset:llama2-7b qlora, bs 4, ctx 512, 5 steps"
  timeout 300 $B --model_name preset:llama2-7b --tokenizer_path builtin:bytes --train_type qlora --dataset dummy \
    --dataset_samples 40 --context_length 512 --pad_to_context_length true --batch_size 4 --max_steps 5 \
    --lora_rank 64 --lora_alpha 16 --lora_dropout 0.1 --log_to stdout --output_dir $W/q7 > $OUT/q7.log 2>&1
  echo "rc=$?"; grep -vE "^\s*$" $OUT/q7.log | tail -14
  [ -f $W/q7/metrics.jsonl ] && cp $W/q7/metrics.jsonl $OUT/q7_metrics.jsonl
fi
