#!/usr/bin/env bash
# The device tool carries at most 64 MiB; binaries and .device/lib are ~27 MiB uncompressed each but
# compress 4-5x (xz). Packs the given paths (files or folders, relative to the repository root) into
# .device/pack.tar.xz; carry [".device/pack.tar.xz"] and start the device command with
#   tar xJf .device/pack.tar.xz && export LD_LIBRARY_PATH=$PWD/.device/lib:$LD_LIBRARY_PATH;
# which puts every path back where it was here. A call script kept under .device (git-ignored)
# reaches the device only if it is packed too.
#   usage: scripts/device_pack.sh build/fsdpq build/tests/fsdpq_gpu_tests .device/lib .device/wheels
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || { echo "usage: $0 PATH..." >&2; exit 2; }
for p in "$@"; do [ -e "$p" ] || { echo "$0: $p does not exist" >&2; exit 2; }; done
mkdir -p .device
git check-ignore -q .device || { echo ".device is not git-ignored: refusing to pack there" >&2; exit 1; }
tar cf - "$@" | xz -T2 -6 > .device/pack.tar.xz.tmp
mv .device/pack.tar.xz.tmp .device/pack.tar.xz
echo ".device/pack.tar.xz: $(du -m .device/pack.tar.xz | cut -f1) MiB ($(du -smc "$@" | tail -1 | cut -f1) MiB unpacked)"
