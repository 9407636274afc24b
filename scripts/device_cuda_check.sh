#!/usr/bin/env bash
# One device call for the CUDA backend (see ../shared/device/README.md): the GPU test binary (op
# parity, NF4, optimizers, whole model), its perf mode, the CLI training on the GPU against the CPU
# backend, and a Llama-2-7B-shape QLoRA run. Prepare here:
#   make build && ./fsdpq demo --out .device/demo --dry_run
#   ../shared/device/bundle-libs.sh build/fsdpq build/tests/fsdpq_gpu_tests .device/lib
# Run there with carry [".device", "build/tests/fsdpq_gpu_tests", "build/fsdpq"]:
#   bash scripts/device_cuda_check.sh  (GPU_FILTER / PERF_FILTER / SKIP=tests,perf,cli,mma,hf,7b,offload,ranks2 narrow it)
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
if ! skip offload; then
  echo "== preset:llama2-7b qlora, bs 4, ctx 512, 10 steps, use_cpu_offload false / true (the same losses expected)"
  for off in false true; do
    timeout 200 $B --model_name preset:llama2-7b --tokenizer_path builtin:bytes --train_type qlora --dataset dummy \
      --dataset_samples 40 --context_length 512 --pad_to_context_length true --batch_size 4 --max_steps 10 \
      --lora_rank 64 --lora_alpha 16 --lora_dropout 0.1 --log_to stdout --use_cpu_offload $off \
      --output_dir $W/off_$off > $OUT/offload_$off.log 2>&1
    echo "use_cpu_offload $off rc=$?"; grep -E "error|GPU memory" $OUT/offload_$off.log | head -3
    cp $W/off_$off/metrics.jsonl $OUT/offload_$off.metrics.jsonl 2>/dev/null
  done
  python3 - $OUT <<'PY'
import json, sys
runs = {}
for off in ("false", "true"):
    try:
        runs[off] = [json.loads(l) for l in open(f"{sys.argv[1]}/offload_{off}.metrics.jsonl")]
    except OSError as e:
        print(off, "no metrics:", e)
for off, rows in runs.items():
    steps = [r for r in rows if r["type"] == "step"]
    summary = next((r for r in rows if r["type"] == "summary"), {})
    tps = sum(s["tokens"] for s in steps[1:]) / sum(s["step_seconds"] for s in steps[1:])
    print(f"offload {off}: {tps:.0f} tok/s, peak allocated {summary.get('peak_device_allocated_bytes', 0) / 2**30:.2f} GiB")
    print("  losses", " ".join(f"{s['loss']:.6f}" for s in steps))
    print("  last step", json.dumps(steps[-1]["phase_seconds"]), "step_seconds", round(steps[-1]["step_seconds"], 4))
if len(runs) == 2:
    a = [r["loss"] for r in runs["false"] if r["type"] == "step"]
    b = [r["loss"] for r in runs["true"] if r["type"] == "step"]
    print("losses identical" if a == b else f"losses differ: worst {max(abs(x - y) for x, y in zip(a, b)):.3g}")
PY
fi
if ! skip ranks2; then
  echo "== 2 ranks on one GPU (MPI staged through the host), demo model, 8 steps: full_shard, shard_grad_op, full_shard + offload"
  for flags in "--sharding_strategy full_shard" "--sharding_strategy shard_grad_op" "--sharding_strategy full_shard --use_cpu_offload true"; do
    name=$(echo "$flags" | tr -c 'a-z_\n' '_')
    FSDPQ_SHARE_GPUS=1 timeout 120 mpirun --allow-run-as-root -np 2 -x LD_LIBRARY_PATH -x FSDPQ_SHARE_GPUS $B --model_name $D/model --dataset alpaca \
      --data_path $D/data.jsonl --dataset_samples 64 --batch_size 2 --context_length 128 --train_type qlora \
      --lora_rank 8 --lora_alpha 16 --lora_dropout 0 --lr 2e-3 --max_steps 8 --log_to stdout $flags \
      --output_dir $W/r2$name > $OUT/ranks2$name.log 2>&1
    echo "$flags rc=$?"; grep -E "error|Error" $OUT/ranks2$name.log | head -3
    python3 -c "import json,sys; print(' '.join(f\"{json.loads(l)['loss']:.4f}\" for l in open(sys.argv[1]) if '\"step\"' in l))" $W/r2$name/metrics.jsonl 2>/dev/null
  done
  CUDA_VISIBLE_DEVICES= timeout 120 mpirun --allow-run-as-root -np 2 -x LD_LIBRARY_PATH -x CUDA_VISIBLE_DEVICES $B --model_name $D/model --dataset alpaca \
      --data_path $D/data.jsonl --dataset_samples 64 --batch_size 2 --context_length 128 --train_type qlora \
      --lora_rank 8 --lora_alpha 16 --lora_dropout 0 --lr 2e-3 --max_steps 8 --log_to stdout \
      --output_dir $W/r2cpu > $OUT/ranks2_cpu.log 2>&1
  echo "cpu backend rc=$?"
  python3 -c "import json,sys; print(' '.join(f\"{json.loads(l)['loss']:.4f}\" for l in open(sys.argv[1]) if '\"step\"' in l))" $W/r2cpu/metrics.jsonl 2>/dev/null
fi
