#!/usr/bin/env bash
# One device call for HQQ (docs/hqq.md): real hqq 0.2.8 on the GPU (the path fsdp_qlora takes)
# against fsdpq's quantisation, the CUDA dequantisation against the CPU's, and hqq_lora training
# on the GPU.
# Prepare here: make build; ./fsdpq demo --out .device/demo --dry_run;
#   pip wheel --no-deps hqq==0.2.8 -w .device/wheels (hqq 0.2.8 is an sdist: built here, pure Python);
#   pip download --no-deps termcolor -d .device/wheels;
#   ../shared/device/bundle-libs.sh build/fsdpq build/tests/fsdpq_unit_tests build/tests/fsdpq_gpu_tests .device/lib
# Run there with carry [".device", "build/fsdpq", "build/tests/fsdpq_unit_tests", "build/tests/fsdpq_gpu_tests"]:
#   bash scripts/device_hqq.sh
export LD_LIBRARY_PATH=$PWD/.device/lib:$LD_LIBRARY_PATH
ROOT=$PWD; PY=$(mktemp -d)
pip install --no-deps --target "$PY" .device/wheels/hqq-0.2.8*.whl .device/wheels/termcolor-*.whl > "$OUT/pip.log" 2>&1
echo "pip rc=$?"

echo "== real hqq on the GPU (tests/reference/hqq_reference.py --solver cuda)"
PYTHONPATH=$PY python3 tests/reference/hqq_reference.py --solver cuda --out "$OUT/hqq" > "$OUT/reference.log" 2>&1
echo "reference rc=$?"; grep -v Warning "$OUT/reference.log" | tail -2

echo "== fsdpq against it (byte for byte: codes, zero_scale, dequantised)"
FSDPQ_HQQ_REFERENCE=$OUT/hqq build/tests/fsdpq_unit_tests --gtest_filter='HqqReference.HalfSolverEqualsHqqOnTheGpu' \
  > "$OUT/compare.log" 2>&1
echo "compare rc=$?"; grep -E "cases equal|differs|PASSED|FAILED" "$OUT/compare.log" | head -20

echo "== CUDA dequantisation against the CPU's"
build/tests/fsdpq_gpu_tests --gtest_filter='GpuHqq.*' > "$OUT/gpu_hqq.log" 2>&1
echo "gpu tests rc=$?"; tail -3 "$OUT/gpu_hqq.log"

echo "== hqq_lora training on the GPU (demo model, 4 and 2 bits), and qlora beside it"
D=$ROOT/.device/demo; W=$(mktemp -d); cd "$W" || exit 1
for run in "hqq_lora 4" "hqq_lora 2" "qlora 4"; do
  set -- $run
  "$ROOT/build/fsdpq" --model_name "$D/model" --dataset alpaca --data_path "$D/data.jsonl" --dataset_samples 320 \
    --batch_size 8 --context_length 256 --train_type "$1" --n_bits "$2" --lora_rank 16 --lora_alpha 32 \
    --lora_dropout 0 --lr 3e-3 --max_steps 40 --log_to stdout --output_dir "out_$1_$2" > "$OUT/train_$1_$2.log" 2>&1
  echo "$1 n_bits=$2 rc=$?: $(grep -E '^model ready' "$OUT/train_$1_$2.log" | cut -c1-60)"
  grep -E "^trained" "$OUT/train_$1_$2.log"
done
