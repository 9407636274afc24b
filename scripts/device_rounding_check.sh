#!/usr/bin/env bash
# One device call on the LoRA addition's rounding (bench/RESULTS.md, stop 37: cuBLAS's in-place
# accumulate rounds the product before adding C; the fold and COMPUTE_32F_PEDANTIC round once;
# CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION changes nothing, stop 38):
#  1. GpuCublasAccumulateProbe.*: which settings keep a sub-ulp C, and the accumulating GEMM's speed
#     each way at the 7B layer's shapes (does the one rounding cost anything?);
#  2. GpuOpsMatmul.AccumulatingIntoBf16* (it sets each mode itself);
#  3. the 7B step: the fold (the default) against the separate products and pedantic;
#  4. HF + PEFT parity with the fold and without it.
# Prepare: ../shared/device/bundle-libs.sh build/fsdpq build/tests/fsdpq_gpu_tests .device/lib &&
#   bash scripts/device_pack.sh build/fsdpq build/tests/fsdpq_gpu_tests .device/lib .device/wheels
# Run with carry [".device/pack.tar.xz"]: tar xJf .device/pack.tar.xz && bash scripts/device_rounding_check.sh
# (~5 minutes; SKIP=speed,test,step,hf narrows it.)
export LD_LIBRARY_PATH=$PWD/.device/lib:${LD_LIBRARY_PATH:-}
T=$PWD/build/tests/fsdpq_gpu_tests
skip() { [[ ",${SKIP:-}," == *",$1,"* ]]; }
nvidia-smi --query-gpu=name --format=csv,noheader
if ! skip speed; then
  FSDPQ_GPU_PERF=1 timeout 60 "$T" --gtest_filter='GpuCublasAccumulateProbe.Speed' 2>&1 | grep "^PERF"
  FSDPQ_GPU_PERF=1 timeout 60 "$T" --gtest_filter='GpuCublasAccumulateProbe.Which*' 2>&1 | grep "^PROBE GemmEx"
fi
if ! skip test; then
  timeout 30 "$T" --gtest_filter='GpuOpsMatmul.Accum*' 2>&1 | grep -E "kept|OK \]|FAILED \]"
fi
if ! skip step; then
  BUILDS="fold=. separate=.@FSDPQ_LORA_FOLD=0 pedantic=.@FSDPQ_LORA_FOLD=0@FSDPQ_GEMM_ACCUMULATE=pedantic" \
    TESTS=none POINTS=false:4 STEPS=6 BUDGET=240 bash scripts/device_compare.sh 2>&1 | grep -E "^\| auto|tokens/s" | head -8
fi
if ! skip hf; then
  for setting in FSDPQ_LORA_FOLD=1 FSDPQ_LORA_FOLD=0; do
    echo "HF + PEFT parity with $setting"
    env $setting HF=1 TESTS=none STEP=0 BUILDS="x=." BUDGET=160 bash scripts/device_compare.sh 2>&1 | grep -E "loss hf"
  done
fi
