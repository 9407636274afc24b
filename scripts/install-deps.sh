#!/usr/bin/env bash
# Installs the Debian packages fsdpq needs; quiet and quick when they are all present.
# CUDA, cuBLAS and NCCL come from /usr/local/cuda when it exists (fsdpq builds without them).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libopenmpi-dev openmpi-bin
  libhdf5-openmpi-dev hdf5-tools
  libsentencepiece-dev sentencepiece python3-sentencepiece
  libpcre2-dev  # the split regexes of byte-level BPE tokenizers (Llama-3)
  nlohmann-json3-dev libfmt-dev
  libgtest-dev
  python3 python3-pytest python3-pandas python3-matplotlib  # analysis/ and its tests
  procps  # pkill, for the preemption test
)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "make deps: installing ${missing[*]}"
sudo=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "make deps: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
# Refresh the package lists when they are missing or older than a day.
if [[ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mtime -1 2>/dev/null | head -n 1)" ]]; then
  $sudo apt-get update -qq
fi
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "make deps: done"
