#!/usr/bin/env bash
# One device call for DoRA (docs/dora.md): the CUDA kernels and the composed op against the CPU,
# fsdpq's GPU training pass against PEFT's use_dora=True (dense and NF4 base, bf16 and fp32),
# a trained DoRA adapter loaded by PEFT (logits and merge), and bnb_dora / hqq_dora training on
# the GPU beside qlora.
# Prepare here: make build; ./fsdpq demo --out .device/demo --dry_run;
#   pip download --no-deps bitsandbytes -d .device/wheels (a manylinux x86_64 wheel);
#   pip wheel --no-deps hqq==0.2.8 -w .device/wheels; pip download --no-deps termcolor -d .device/wheels;
#   ../shared/device/bundle-libs.sh build/fsdpq build/tests/fsdpq_gpu_tests .device/lib
# Run there with carry [".device", "build/fsdpq", "build/tests/fsdpq_gpu_tests"]:
#   bash scripts/device_dora.sh
export LD_LIBRARY_PATH=$PWD/.device/lib:$LD_LIBRARY_PATH
ROOT=$PWD; B=$ROOT/build/fsdpq; T=$ROOT/build/tests/fsdpq_gpu_tests; R=$ROOT/tests/reference
D=$ROOT/.device/demo; W=$(mktemp -d); PY=$(mktemp -d)
python3 -m pip install -q --no-deps --target "$PY" .device/wheels/bitsandbytes-*.whl > "$OUT/pip.log" 2>&1
echo "pip rc=$?"

echo "== DoRA kernels and op on the GPU against the CPU (tests/gpu/ops_dora_gpu_test.cpp)"
"$T" --gtest_filter='GpuDora.*' > "$OUT/gpu_dora.log" 2>&1
echo "gpu tests rc=$?"; grep -E "Failure|error [0-9]|PASSED|FAILED" "$OUT/gpu_dora.log" | head -20

echo "== the GPU training pass against PEFT use_dora=True (tests/reference/hf_train_parity.py --dora)"
for p in bf16 fp32; do
  PYTHONPATH=$PY timeout 300 python3 "$R/hf_train_parity.py" --fsdpq "$B" --gpu-tests "$T" --dir "$W/parity_$p" \
    --precision $p --dora > "$OUT/hf_parity_dora_$p.log" 2>&1
  echo "$p rc=$?"; grep -E "loss hf|MISMATCH|Error" "$OUT/hf_parity_dora_$p.log" | head -8
done

echo "== a bnb_dora adapter (fp32) in PEFT: tensors, logits of fsdpq generate, the merge (peft_load_check.py)"
cd "$W" || exit 1
"$B" --model_name "$D/model" --dataset alpaca --data_path "$D/data.jsonl" --dataset_samples 64 --batch_size 4 \
  --context_length 128 --train_type bnb_dora --precision fp32 --lora_rank 8 --lora_alpha 16 --lora_dropout 0.1 \
  --lr 2e-3 --max_steps 12 --save_model true --output_dir dora_ad --log_to stdout > "$OUT/train_fp32.log" 2>&1
echo "train rc=$?"; grep -E "^trained" "$OUT/train_fp32.log"
# The adapter over the dense fp32 base in both fsdpq and PEFT: the tight check.
"$B" generate --model "$D/model" --adapter dora_ad --prompt "Add 2 and 3" --max_new_tokens 1 --temperature 0 \
  --train_type lora --precision fp32 --logits_out logits.json > "$OUT/gen.log" 2>&1
echo "generate rc=$?"
"$B" merge --model "$D/model" --adapter dora_ad --out merged > "$OUT/merge.log" 2>&1; echo "merge rc=$?"
python3 "$R/peft_load_check.py" --base "$D/model" --adapter dora_ad --logits logits.json --merged merged \
  --dtype float32 > "$OUT/peft_dora.log" 2>&1
echo "peft check rc=$?"; tail -6 "$OUT/peft_dora.log"

echo "== bnb_dora / hqq_dora training on the GPU (demo model), qlora beside them"
for run in "qlora 4 0" "bnb_dora 4 0" "bnb_dora 4 0.1" "hqq_dora 4 0" "hqq_dora 2 0"; do
  set -- $run
  "$B" --model_name "$D/model" --dataset alpaca --data_path "$D/data.jsonl" --dataset_samples 320 \
    --batch_size 8 --context_length 256 --train_type "$1" --n_bits "$2" --lora_rank 16 --lora_alpha 32 \
    --lora_dropout "$3" --lr 3e-3 --max_steps 40 --log_to stdout --output_dir "out_$1_$2_$3" > "$OUT/train_$1_$2_$3.log" 2>&1
  echo "$1 n_bits=$2 dropout=$3 rc=$?"
  grep -E "^trained" "$OUT/train_$1_$2_$3.log"
done
