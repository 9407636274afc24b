#!/usr/bin/env bash
# Builds fsdpq at several commits, each in a worktree of its own, and puts each binary where
# scripts/device_compare.sh reads a build: .device/points/<label>/build/fsdpq. For before/after
# points that need old builds in the same device job (issue #23's: each refactor merge against its
# first parent). Run here (a build is ~12 minutes on 2 cores, less where ccache has the objects);
# the worktrees stay under /work/wt-points/ for the session.
#   usage: scripts/build_points.sh LABEL=COMMIT ...
#   e.g.   scripts/build_points.sh arch=7f8091f arch0=7f8091f^1 quant=0526263 quant0=0526263^1
# then pack and run:
#   scripts/device_pack.sh .device/points .device/lib   (with the newest build's libraries)
#   BUILDS="arch0=.device/points/arch0 arch=.device/points/arch ..." TESTS=none POINTS="true:8" \
#     bash scripts/device_compare.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || { echo "usage: $0 LABEL=COMMIT ..." >&2; exit 2; }
root=$PWD
mkdir -p .device/points
git check-ignore -q .device || { echo ".device is not git-ignored: refusing to write there" >&2; exit 1; }
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-/work} CCACHE_DIR=${CCACHE_DIR:-/work/.ccache}
launcher=""
command -v ccache > /dev/null && launcher="-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache"
for point in "$@"; do
  label=${point%%=*} commit=${point#*=}
  [[ $label =~ ^[A-Za-z0-9_]+$ ]] || { echo "$0: label '$label' must be letters, digits, _" >&2; exit 2; }
  sha=$(git rev-parse --verify "$commit^{commit}") || { echo "$0: no commit '$commit'" >&2; exit 2; }
  tree=/work/wt-points/$label
  if [ ! -d "$tree" ]; then
    git worktree add --detach "$tree" "$sha" > /dev/null
  else
    git -C "$tree" checkout -q --detach "$sha"
  fi
  echo "== $label: $(git log --oneline -1 "$sha" | cut -c1-100)"
  started=$(date +%s)
  # Only the binary: the points run the 7B step, not the tests (a third of the build time).
  { make -C "$tree" configure CMAKE_FLAGS="$launcher" && cmake --build "$tree/build" -j 2 --target fsdpq; } \
    > "$tree.build.log" 2>&1 ||
    { echo "$0: the build of $label failed; see $tree.build.log" >&2; exit 1; }
  mkdir -p ".device/points/$label/build"
  cp "$tree/build/fsdpq" ".device/points/$label/build/fsdpq"
  echo "   built in $(( $(date +%s) - started )) s: .device/points/$label/build/fsdpq"
done
echo "pack with: scripts/device_pack.sh .device/points .device/lib"
