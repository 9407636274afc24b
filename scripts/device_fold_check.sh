#!/usr/bin/env bash
# One device call that finds where FSDPQ_LORA_FOLD=1 leaves the separate path on the GPU (on the 7B
# step at stop 36 its losses fell ~300x faster from the second step on, while the GPU tests, one
# pass of a narrow model with B random, agree): a few steps of a 1-layer model of the 7B's width
# and of the tiny preset, separate and folded, with the dequantisation on the side stream and on
# the compute stream, with and without dropout; the losses and gradient norms of each, to set
# against the CPU's (`FSDPQ_LORA_FOLD=0|1 build/fsdpq ...` with the same flags here). Then, while
# the machine is up: the step with the fused LoRA kernels against the separate ones without the
# section timer, and bnb_dora with FSDPQ_DORA_NORM=direct against expanded.
# Prepare: scripts/device_pack.sh build/fsdpq build/tests/fsdpq_gpu_tests .device/lib
# Run with carry [".device/pack.tar.xz"]: tar xJf .device/pack.tar.xz && bash scripts/device_fold_check.sh
export LD_LIBRARY_PATH=$PWD/.device/lib:${LD_LIBRARY_PATH:-}
B=$PWD/build/fsdpq; W=$(mktemp -d); OUT=${OUT:-$W}
nvidia-smi --query-gpu=name --format=csv,noheader
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
  "$B" init-model --preset llama2-7b --num_hidden_layers 1 --out "$W/m7" > /dev/null 2>&1
  "$B" init-model --preset tiny --out "$W/mt" > /dev/null 2>&1
  for model in m7 mt; do
    flags=(--model_name "$W/$model" --tokenizer_path builtin:bytes --train_type qlora --dataset dummy --dataset_samples 8
           --context_length 512 --pad_to_context_length true --batch_size 1 --max_steps 4 --lora_rank 64
           --lora_alpha 16 --use_gradient_checkpointing false)
    for dropout in 0.1 0.0; do
      run ${model}_sep_d$dropout "FSDPQ_LORA_FOLD=0" "${flags[@]}" --lora_dropout $dropout
      run ${model}_fold_d$dropout "FSDPQ_LORA_FOLD=1" "${flags[@]}" --lora_dropout $dropout
      run ${model}_foldc_d$dropout "FSDPQ_LORA_FOLD=1 FSDPQ_DEQUANTIZE_STREAM=compute" "${flags[@]}" --lora_dropout $dropout
    done
  done
fi

if [ "${SKIP_STEP:-0}" != 1 ]; then
  seven=(--model_name preset:llama2-7b --tokenizer_path builtin:bytes --dataset dummy --dataset_samples 80
         --context_length 2048 --pad_to_context_length true --batch_size 4 --max_steps 6 --lora_rank 64
         --lora_alpha 16 --lora_dropout 0.1 --use_gradient_checkpointing false)
  # The learning itself: every step of the dummy data has the same loss at a learning rate of ~0,
  # so each run's fall in loss is what its LoRA updates do to the forward.
  run sep_lr0 "" "${seven[@]}" --train_type qlora --max_steps 4 --lr 1e-12
  run fold_lr0 "FSDPQ_LORA_FOLD=1" "${seven[@]}" --train_type qlora --max_steps 4 --lr 1e-12
  run sep_compute "FSDPQ_DEQUANTIZE_STREAM=compute" "${seven[@]}" --train_type qlora
  run fold_compute "FSDPQ_LORA_FOLD=1 FSDPQ_DEQUANTIZE_STREAM=compute" "${seven[@]}" --train_type qlora
  run sep_nosec "FSDPQ_SECTION_TIMES=0" "${seven[@]}" --train_type qlora --profile_memory true
  run fused_nosec "FSDPQ_SECTION_TIMES=0 FSDPQ_LORA_KERNELS=fused" "${seven[@]}" --train_type qlora --profile_memory true
  run dora_direct "FSDPQ_DORA_NORM=direct" "${seven[@]}" --train_type bnb_dora
  run dora_expanded "FSDPQ_DORA_NORM=expanded" "${seven[@]}" --train_type bnb_dora
  for name in sep_nosec fused_nosec; do  # the caching allocator's misses after each optimizer step
    echo "$name cudaMallocs: $(python3 -c "import json,sys; print(' '.join(str(r.get('device_allocations')) for r in map(json.loads, open(sys.argv[1])) if r.get('type') == 'memory' and r.get('at') == 'after_optimizer'))" "$W/$name/metrics.jsonl")"
  done
fi
