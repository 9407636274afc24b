#!/usr/bin/env bash
# One short device call for stop 46's kept dense layers (keep_dequantized_layers made dense once and
# read by every later pass) against a binary that makes them dense every forward (BASE, e.g. a build
# of 8a06a58): GpuModel.Kept* (the same bits as dequantising every pass), the 7B step at ctx 2048,
# bs 4, no checkpointing, every layer kept (base, new, base, new), and inputs/sql.ini's job
# (padding_free) without checkpointing, every layer kept, on both binaries. ~3 minutes.
# Prepare here:
#   mkdir -p .device/data .device/base/build && cp ../shared/data/sql.jsonl ../shared/data/tokenizer.model .device/data/
#   cp <worktree>/build/fsdpq .device/base/build/fsdpq
#   ../shared/device/bundle-libs.sh build/fsdpq build/tests/fsdpq_gpu_tests .device/lib
#   bash scripts/device_pack.sh .device/lib build/fsdpq build/tests/fsdpq_gpu_tests .device/base .device/data
# Run there with carry [".device/pack.tar.xz"]:
#   tar xJf .device/pack.tar.xz && bash scripts/device_kept_dense_across_steps.sh
export LD_LIBRARY_PATH=$PWD/.device/lib:${LD_LIBRARY_PATH:-}
NEW=$PWD/build/fsdpq; BASE=${BASE:-$PWD/.device/base/build/fsdpq}; W=$(mktemp -d)
nvidia-smi --query-gpu=name --format=csv,noheader; date +%T
timeout 90 build/tests/fsdpq_gpu_tests --gtest_filter='GpuModel.Kept*' > $OUT/gpu_tests.log 2>&1
echo "GpuModel.Kept* rc=$?"; grep -E "^\[  (PASSED|FAILED)|^\[  FAILED" $OUT/gpu_tests.log | head -5

# Mean tokens/s (or real tokens/s where the run logs them) of the steps after the first two, and peak.
rates() {
  python3 - "$1" <<'PY'
import json, sys
rows = list(map(json.loads, open(sys.argv[1])))
steps = [r for r in rows if r.get("type") == "step"][2:]
secs = sum(s["step_seconds"] for s in steps)
peak = next((r.get("peak_device_allocated_bytes", 0) for r in rows if r.get("type") == "summary"), 0)
print(f"{len(steps)} steps: {sum(s['tokens'] for s in steps) / secs:,.0f} tokens/s, "
      f"{sum(s.get('real_tokens', 0) for s in steps) / secs:,.0f} real tokens/s, peak {peak / 2**30:.2f} GiB, "
      f"losses {[round(s['loss'], 4) for s in steps][:3]}")
PY
}
run() {  # run NAME BINARY FLAGS...
  local name=$1 binary=$2; shift 2
  FSDPQ_SECTION_TIMES=1 timeout 150 "$binary" "$@" --log_to stdout --output_dir "$W/$name" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(rates "$W/$name/metrics.jsonl" 2>&1 | tail -1) nf4: $(grep -h 'section nf4' "$OUT/$name.log" | sed 's/.*nf4 dequantize *//')"
}
STEP=(--model_name preset:llama2-7b --tokenizer_path builtin:bytes --train_type qlora --dataset dummy
      --dataset_samples 80 --context_length 2048 --pad_to_context_length true --batch_size 4 --max_steps 8
      --lora_rank 64 --lora_alpha 16 --lora_dropout 0.1 --use_gradient_checkpointing false --keep_dequantized_layers 32)
SQL=(inputs/sql.ini --model_name preset:llama2-7b --tokenizer_path .device/data/tokenizer.model
     --data_path .device/data/sql.jsonl --max_steps 14 --save_model false --save_every_steps 0
     --use_gradient_checkpointing false --keep_dequantized_layers 32)
for i in 1 2; do
  run "step_base$i" "$BASE" "${STEP[@]}"
  run "step_new$i" "$NEW" "${STEP[@]}"
done
run sql_base "$BASE" "${SQL[@]}"
run sql_new "$NEW" "${SQL[@]}"
date +%T
