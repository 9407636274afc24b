#!/usr/bin/env bash
# One device call for issue #22 route 1's first piece, the Hopper (sm_90a) attention forward
# (docs/cuda.md, "Hopper wgmma attention"): the primitives' tile products, every route against the
# CPU op (wgmma among them), the whole model on FSDPQ_ATTENTION=wgmma, and the perf rows of wgmma
# beside mma and cuDNN. cuDNN (for its perf rows) is PyTorch's, as in scripts/device_attention.sh.
# Every step runs under `timeout`: a pipeline bug in the kernel hangs rather than fails. Prepare here:
#   cmake --build build -j1 --target fsdpq_gpu_tests && ../shared/device/bundle-libs.sh build/tests/fsdpq_gpu_tests .device/lib
# Run there with carry [".device/lib", "build/tests/fsdpq_gpu_tests"]:
#   bash scripts/device_wgmma.sh   (at most ~10 minutes; SKIP=tiles,routes,model,perf,ncu splits it over calls)
T=$PWD/build/tests/fsdpq_gpu_tests
OUT=${OUT:-/tmp}
skip() { [[ ",${SKIP:-}," == *",$1,"* ]]; }
CUDNN_LIB=$(python3 - <<'PY'
import glob, importlib.util, os
spec = importlib.util.find_spec("nvidia.cudnn")
places = [os.path.join(p, "lib") for p in (spec.submodule_search_locations or [])] if spec else []
print(next((p for p in places if glob.glob(os.path.join(p, "libcudnn.so.9*"))), ""))
PY
)
export LD_LIBRARY_PATH=$PWD/.device/lib:${LD_LIBRARY_PATH:-}${CUDNN_LIB:+:$CUDNN_LIB}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "kernel images: $(cuobjdump -sass "$T" 2>/dev/null | grep -c HGMMA) HGMMA, $(cuobjdump -sass "$T" 2>/dev/null | grep -c UTMALDG) UTMALDG (0: no cuobjdump here)"
# A serialised kernel (ptxas put a wait behind every wgmma: docs/cuda.md) has as many waits as products.
cuobjdump -sass "$T" 2>/dev/null | awk '/Function :/ { if (name) print name, h, d; name = ""; h = d = 0 }
  /Function : .*attention_(dq|dkdv)_sm90a_kernel|Function : .*attention_sm90a_kernel/ { name = $3 }
  name && /HGMMA/ { h++ } name && /WARPGROUP.DEPBAR/ { d++ } END { if (name) print name, h, d }' |
  sed -E 's/.*(attention_[a-z]*_?sm90a_kernel)I([0-9]*__[a-z_0-9]*)Li([0-9]*)ELb([01]).* ([0-9]+) ([0-9]+)$/\1 \2 D\3 segments=\4: \5 HGMMA, \6 waits/'


if ! skip tiles; then
  echo "== one warpgroup tile through TMA + wgmma (GpuHopperWgmma.*)"
  timeout 60 "$T" --gtest_filter='GpuHopperWgmma.*' > $OUT/wgmma_tiles.log 2>&1
  echo "rc=$? (124: hung)"
  grep -E "^\[ +(OK|FAILED|SKIPPED) +\]|Failure|normalized error|WGMMA tile|Skipped" $OUT/wgmma_tiles.log | head -20
fi

if ! skip routes; then
  echo "== every route against the CPU op (GpuOpsAttentionRoutes.*), wgmma's rows"
  timeout 300 "$T" --gtest_filter='GpuOpsAttentionRoutes.*' > $OUT/wgmma_routes.log 2>&1
  echo "rc=$? (124: hung)"
  grep -E "^\[ +(OK|FAILED) +\]|Failure|wgmma: " $OUT/wgmma_routes.log | head -30
  grep -E "^ROUTE wgmma " $OUT/wgmma_routes.log | head -100
  grep -c "^ROUTE wgmma .*forward on wgmma, backward on wgmma" $OUT/wgmma_routes.log | sed 's/^/wgmma route, both passes on the wgmma kernels: /'
fi

if ! skip model; then
  echo "== whole model against the CPU backend, FSDPQ_ATTENTION=wgmma"
  FSDPQ_ATTENTION=wgmma timeout 60 "$T" --gtest_filter='GpuModel.*' 2>&1 \
    | grep -E "^\[ +(OK|FAILED) +\]|Failure|normalized|warning:" | head -12
fi

if ! skip perf; then
  echo "== perf (GpuOpsAttentionCudnn.Perf; TFLOP/s causal, FlashAttention's FLOP count)"
  FSDPQ_GPU_PERF=1 timeout 150 "$T" --gtest_filter='GpuOpsAttentionCudnn.Perf' 2>&1 | grep -E "PERF|SKIPPED|Skipped" \
    > $OUT/wgmma_perf.txt
  echo "rc=$?"
  grep -E "PERF attention|SKIPPED|Skipped" $OUT/wgmma_perf.txt
fi

if ! skip ncu; then
  # Where the backward's time goes: a launch of each backward kernel in the perf test at T 2048
  # (FSDPQ_PERF_T, NCU_T= another), one ncu pass per kernel so the forward's many launches do not crowd them
  # out; speed of light, occupancy and the warps' stall reasons.
  echo "== ncu: the wgmma backward kernels, one at a time"
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  if [ -z "$NCU" ]; then echo "no ncu here"; else
    for kernel in dkdv_sm90a dq_sm90a prepare_kernel; do
      FSDPQ_GPU_PERF=1 FSDPQ_PERF_T=${NCU_T:-2048} timeout 120 "$NCU" --clock-control none --kernel-name regex:$kernel --launch-skip 2 --launch-count 1 \
        --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats \
        "$T" --gtest_filter='GpuOpsAttentionCudnn.Perf' > $OUT/wgmma_ncu_$kernel.txt 2>&1
      echo "-- $kernel rc=$?"
      grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per Thread|Achieved Occupancy|Stall|Issued Warp|No Eligible|Warp Cycles Per Issued" \
        $OUT/wgmma_ncu_$kernel.txt | head -16
    done
  fi
fi
