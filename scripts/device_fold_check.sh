#!/usr/bin/env bash
# One device call on the fold's diverging losses (bench/RESULTS.md, stop 36): on the 7B step the
# folded path's loss falls ~0.07 a step at lr 1e-5 and the separate and fused paths' ~0.0002, from
# the same parameters (the first update is bit-identical). Depth scaling on the CPU (1 layer of the
# 7B's width: -0.011 a step, 4 layers: -0.028) says the fold is the plausible one. This runs the
# same models as the CPU did (numbers below) on the GPU, and the 7B with one thing changed at a
# time (dequantisation stream, dropout, attention route, lr ~0), then, while the machine is up, the
# step without the section timer (separate, fused) and bnb_dora's two norm routes.
# Prepare: scripts/device_pack.sh build/fsdpq build/tests/fsdpq_gpu_tests .device/lib
# Run with carry [".device/pack.tar.xz"]: tar xJf .device/pack.tar.xz && bash scripts/device_fold_check.sh
# (MODELS="m4" QUICK=1: the 4-layer model against the CPU, then the 7B with the dequantisation in line
# and without dropout, ~100 s.)
export LD_LIBRARY_PATH=$PWD/.device/lib:${LD_LIBRARY_PATH:-}
B=$PWD/build/fsdpq; W=$(mktemp -d); OUT=${OUT:-$W}
nvidia-smi --query-gpu=name --format=csv,noheader
# First the op itself: does cuBLAS's accumulate into bf16 keep a sub-ulp addend as the CPU does?
"$PWD/build/tests/fsdpq_gpu_tests" --gtest_filter='GpuOpsMatmul.AccumulatingIntoBf16*' 2>&1 | grep -E "kept|OK \]|FAILED \]"
losses() {  # the step records' losses, gradient norms and seconds
  python3 - "$1" <<'PY' 2>&1 | head -c 400
import json, sys
r = [x for x in map(json.loads, open(sys.argv[1])) if x.get("type") == "step"]
print(" ".join("%.5f" % x["loss"] for x in r), "| norms", " ".join("%.5f" % x.get("grad_norm", 0) for x in r),
      "| s", " ".join("%.3f" % x["step_seconds"] for x in r))
PY
}
run() {  # name, environment settings, then fsdpq flags
  local name=$1 env=$2; shift 2
  env $env timeout 120 "$B" "$@" --log_to stdout --output_dir "$W/$name" > "$OUT/$name.log" 2>&1
  echo "$name [$env] rc=$? $(losses "$W/$name/metrics.jsonl")"; grep -m2 -E "error" "$OUT/$name.log"
}

if [ "${SKIP_FOLD:-0}" != 1 ]; then
  # The CPU's numbers for these (stop 36, the same init-model seed and dummy data):
  #   m4 (4 layers) sep d0.1: 11.38613 11.35860 11.33359 (norms 1.8358 1.8345 1.8653)
  #   m7 (1 layer) sep d0.1: 11.00582 10.99513 10.98497 10.97256; fold: 11.00582 10.99473 10.98461 10.97261
  #   mt (tiny) sep d0.1: 10.29941 10.29902 10.29864 10.29818; fold: 10.29941 10.29900 10.29863 10.29816
  "$B" init-model --preset llama2-7b --num_hidden_layers 4 --out "$W/m4" > /dev/null 2>&1
  "$B" init-model --preset llama2-7b --num_hidden_layers 1 --out "$W/m7" > /dev/null 2>&1
  "$B" init-model --preset tiny --out "$W/mt" > /dev/null 2>&1
  for model in ${MODELS:-m4 m7 mt}; do
    flags=(--model_name "$W/$model" --tokenizer_path builtin:bytes --train_type qlora --dataset dummy --dataset_samples 8
           --context_length 512 --pad_to_context_length true --batch_size 1 --max_steps 4 --lora_rank 64
           --lora_alpha 16 --use_gradient_checkpointing false --lora_dropout 0.1)
    run ${model}_sep "FSDPQ_LORA_FOLD=0" "${flags[@]}"
    run ${model}_fold "FSDPQ_LORA_FOLD=1" "${flags[@]}"
    [ $model = m4 ] && run ${model}_sep_compute "FSDPQ_DEQUANTIZE_STREAM=compute" "${flags[@]}"
  done
fi

if [ "${SKIP_STEP:-0}" != 1 ]; then
  seven=(--model_name preset:llama2-7b --tokenizer_path builtin:bytes --dataset dummy --dataset_samples 80
         --context_length 2048 --pad_to_context_length true --batch_size 4 --max_steps 6 --lora_rank 64
         --lora_alpha 16 --lora_dropout 0.1 --use_gradient_checkpointing false)
  # One change at a time against the separate path's flat losses (bench/RESULTS.md, stop 36).
  run sep_compute "FSDPQ_DEQUANTIZE_STREAM=compute" "${seven[@]}" --train_type qlora --max_steps 3
  run sep_nodropout "" "${seven[@]}" --train_type qlora --max_steps 3 --lora_dropout 0
  [ -n "${QUICK:-}" ] && exit 0  # QUICK=1: the two that split the question first
  # Every step of the dummy data has the same loss at a learning rate of ~0, so each run's fall in
  # loss is what its LoRA updates do to the forward.
  run sep_lr0 "" "${seven[@]}" --train_type qlora --max_steps 3 --lr 1e-12
  run sep_mma "FSDPQ_ATTENTION=mma" "${seven[@]}" --train_type qlora --max_steps 3
  run fold_compute "FSDPQ_LORA_FOLD=1 FSDPQ_DEQUANTIZE_STREAM=compute" "${seven[@]}" --train_type qlora --max_steps 3
  run sep_nosec "FSDPQ_SECTION_TIMES=0" "${seven[@]}" --train_type qlora --profile_memory true
  run fused_nosec "FSDPQ_SECTION_TIMES=0 FSDPQ_LORA_KERNELS=fused" "${seven[@]}" --train_type qlora --profile_memory true
  run dora_direct "FSDPQ_DORA_NORM=direct" "${seven[@]}" --train_type bnb_dora
  run dora_expanded "FSDPQ_DORA_NORM=expanded" "${seven[@]}" --train_type bnb_dora
  for name in sep_nosec fused_nosec; do  # the caching allocator's misses after each optimizer step
    echo "$name cudaMallocs: $(python3 -c "import json,sys; print(' '.join(str(r.get('device_allocations')) for r in map(json.loads, open(sys.argv[1])) if r.get('type') == 'memory' and r.get('at') == 'after_optimizer'))" "$W/$name/metrics.jsonl")"
  done
fi
