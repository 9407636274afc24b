#!/usr/bin/env bash
# Run HERE (PyPI reachable), not on the GPU machine: put a bitsandbytes wheel into .device/wheels.
# The wheel ships CUDA libraries for every CUDA from 11.8 to 13.2 (42 MB), which with .device/lib
# would pass the device tool's 64 MiB carry limit; the GPU machine's torch is cu130, so the copy kept
# holds only the CUDA 13 and CPU libraries (RECORD rewritten to match, so pip installs it normally).
# It also puts liger-kernel's wheel there (pure Python + Triton, ~1 MB; the version issue #24 names) for
# the hf_lora_liger peer and peer_train.py --liger.
#   usage: bench/fetch_peer_wheels.sh [BNB_VERSION]      (default: the newest bitsandbytes)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=.device/wheels
mkdir -p .device && git check-ignore -q .device || { echo ".device is not git-ignored: refusing to put wheels there" >&2; exit 1; }
mkdir -p "$dir" && rm -f "$dir"/bitsandbytes-*.whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_24_x86_64 -d "$dir" "bitsandbytes${1:+==$1}"
python3 - "$dir"/bitsandbytes-*.whl <<'EOF'
import os, re, sys, zipfile
path = sys.argv[1]
keep = lambda n: not re.search(r"libbitsandbytes_(cuda|rocm|xpu)", n) or "libbitsandbytes_cuda13" in n
with zipfile.ZipFile(path) as src:
    items = [(i, src.read(i)) for i in src.infolist() if keep(i.filename)]
with zipfile.ZipFile(path + ".tmp", "w", zipfile.ZIP_DEFLATED) as dst:
    for info, data in items:
        if info.filename.endswith(".dist-info/RECORD"):
            data = b"".join(l for l in data.splitlines(True) if keep(l.decode().split(",")[0]))
        dst.writestr(info, data, zipfile.ZIP_DEFLATED)
os.replace(path + ".tmp", path)
print(f"{os.path.basename(path)}: {os.path.getsize(path) / 2**20:.1f} MiB (CUDA 13 + CPU libraries)")
EOF
rm -f "$dir"/liger_kernel-*.whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d "$dir" "liger-kernel==${LIGER_VERSION:-0.8.5}"
ls "$dir"/liger_kernel-*.whl
