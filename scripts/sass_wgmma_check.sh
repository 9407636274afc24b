#!/usr/bin/env bash
# Whether ptxas serialised a kernel's wgmma products, without a GPU: compiles an sm_90a source to an
# object, disassembles it (cuobjdump from NVIDIA's PyPI wheel, fetched once into .tools/ where the
# CUDA toolkit here has none) and prints, per kernel, its HGMMA instructions, the WARPGROUP.DEPBAR
# waits among them, its local-memory traffic (STL / LDL) and its generic loads and stores (LD.E /
# ST.E: shared memory reached through a pointer that lost its address space, docs/cuda.md). A
# serialised kernel has about as many waits as products (ptxas puts a wait behind each, often
# without a warning: docs/cuda.md); a healthy one a few per loop iteration.
#   usage: scripts/sass_wgmma_check.sh kernels/attention_backward_sm90a.cu [kernel-name-regex]
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:?usage: $0 SOURCE.cu [KERNEL_REGEX]}
pattern=${2:-.}
# cuobjdump -sass runs nvdisasm: both from the toolkit, or both from their wheels into .tools/.
if ! command -v cuobjdump > /dev/null || ! command -v nvdisasm > /dev/null; then
  if [ -x /usr/local/cuda/bin/cuobjdump ] && [ -x /usr/local/cuda/bin/nvdisasm ]; then
    export PATH=/usr/local/cuda/bin:$PATH
  else
    bin=$PWD/.tools/cuda-bin/nvidia/cu13/bin
    if [ ! -x "$bin/cuobjdump" ] || [ ! -x "$bin/nvdisasm" ]; then
      mkdir -p .tools/cuda-bin
      python3 -m pip download --no-deps -q nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm -d .tools/cuda-bin
      for w in .tools/cuda-bin/*.whl; do python3 -m zipfile -e "$w" .tools/cuda-bin/; done
      chmod +x "$bin"/*
    fi
    export PATH=$bin:$PATH
  fi
fi
obj=$(mktemp --suffix=.o)
log=$(mktemp)
trap 'rm -f "$obj" "$log"' EXIT
/usr/local/cuda/bin/nvcc -O3 -DNDEBUG --generate-code=arch=compute_90a,code=sm_90a -std=c++17 -I. -Isrc -c "$src" -o "$obj" \
  > "$log" 2>&1 || { cat "$log" >&2; exit 1; }
cuobjdump -sass "$obj" | awk -v pattern="$pattern" '
  /Function : / { if (name != "" && name ~ pattern) report(); name = $3; hgmma = depbar = stl = ldl = generic = 0; next }
  /HGMMA/ { hgmma++ } /WARPGROUP.DEPBAR/ { depbar++ } /STL/ { stl++ } /LDL/ { ldl++ } / (LD|ST)\.E/ { generic++ }
  function report() { if (hgmma > 0) printf "%s\tHGMMA %3d  DEPBAR %3d  STL %2d  LDL %2d  generic LD/ST %2d%s%s\n", name, hgmma, depbar, stl, ldl, generic, (depbar * 2 > hgmma ? "  <- serialised?" : ""), (generic > 0 ? "  <- shared memory through generic pointers?" : "") }
  END { if (name ~ pattern) report() }' |
  c++filt | sed -E 's/fsdpq::cuda::\(anonymous namespace\):://; s/\(CUtensorMap[^\t]*\t/\t/; s/\([^\t]*\)\t/\t/' | column -t -s $'\t'
