#!/usr/bin/env bash
# One device call: Nsight Compute on chosen kernels of a perf-mode GPU test, one launch each (after
# the warm-up launches), with the sections that say what limits a kernel: speed of light, occupancy,
# the warps' stall reasons, the pipes' utilisation (tensor, ALU, FMA, XU: is it ALU-bound?).
# Prepare: ../shared/device/bundle-libs.sh build/tests/fsdpq_gpu_tests .device/lib &&
#   bash scripts/device_pack.sh build/tests/fsdpq_gpu_tests .device/lib
# Run with carry [".device/pack.tar.xz"], e.g.
#   tar xJf .device/pack.tar.xz && FILTER='GpuOpsLoraFused.Perf' KERNELS="lora_down_sm90a lora_input_grad_sm90a" bash scripts/device_ncu.sh
#   tar xJf .device/pack.tar.xz && FILTER='GpuOpsAttentionCudnn.Perf' ENVS="FSDPQ_PERF_T=2048" KERNELS="dkdv_sm90a dq_sm90a" bash scripts/device_ncu.sh
# (SKIP_LAUNCHES, default 3: launches of each kernel passed over first. SASS=1: the full set instead,
# and each kernel's per-instruction SASS page kept as $OUT/ncu_<kernel>.sass.csv.xz for
# analysis/ncu_instruction_mix.py to read here.)
export LD_LIBRARY_PATH=$PWD/.device/lib:${LD_LIBRARY_PATH:-}
T=$PWD/build/tests/fsdpq_gpu_tests
OUT=${OUT:-/tmp}
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -z "$NCU" ]; then echo "no ncu on this machine"; exit 0; fi
nvidia-smi --query-gpu=name --format=csv,noheader
sections="--section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats
  --section ComputeWorkloadAnalysis --section LaunchStats"
[ "${SASS:-0}" = 1 ] && sections="--set full"
for kernel in ${KERNELS:?set KERNELS to kernel name regexes}; do
  rep=$(mktemp -d)/$kernel
  env FSDPQ_GPU_PERF=1 ${ENVS:-} timeout 150 "$NCU" --clock-control none --kernel-name regex:"$kernel" \
    --launch-skip "${SKIP_LAUNCHES:-3}" --launch-count 1 $sections -o "$rep" -f \
    "$T" --gtest_filter="${FILTER:?set FILTER to the perf test}" > /dev/null 2>&1
  echo "-- $kernel rc=$?"
  "$NCU" -i "$rep.ncu-rep" --page details > "$OUT/ncu_$kernel.txt" 2>&1
  [ "${SASS:-0}" = 1 ] && "$NCU" -i "$rep.ncu-rep" --page source --csv --print-source sass 2>/dev/null |
    xz -6 > "$OUT/ncu_$kernel.sass.csv.xz"
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per Thread|Achieved Occupancy|Issued Warp|No Eligible|Warp Cycles Per Issued|Stall|Pipe|Executed Ipc" \
    "$OUT/ncu_$kernel.txt" | head -30
done
