#!/usr/bin/env bash
# The session's closing device call: the whole GPU test binary, then Llama-2-7B-shape QLoRA with
# CPU offload and at context 2048 (fsdpq alone; the peers' figures are in bench/RESULTS.md).
export LD_LIBRARY_PATH=$PWD/.device/lib:$LD_LIBRARY_PATH
B=$PWD/build/fsdpq; W=$(mktemp -d)
echo "== all gpu tests"; timeout 150 build/tests/fsdpq_gpu_tests > $OUT/gpu_all.log 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|tests ran" $OUT/gpu_all.log | head -20
q7() {  # name, extra flags
  local name=$1; shift
  timeout 120 $B --model_name preset:llama2-7b --tokenizer_path builtin:bytes --train_type qlora --dataset dummy \
    --dataset_samples 64 --pad_to_context_length true --max_steps 4 --lora_rank 64 --lora_alpha 16 \
    --lora_dropout 0.1 --log_to stdout --output_dir $W/$name "$@" > $OUT/$name.log 2>&1
  echo "$name rc=$?"; grep -E "tok/s|GPU memory|error" $OUT/$name.log | tail -3
  cp $W/$name/metrics.jsonl $OUT/$name.metrics.jsonl 2>/dev/null
}
q7 offload --context_length 512 --batch_size 4 --use_cpu_offload true
q7 ctx2048 --context_length 2048 --batch_size 4
