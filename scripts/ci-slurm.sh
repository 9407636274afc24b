#!/bin/bash
# CI for the Slurm side (run by .ci/run after `make test`, which built ./fsdpq and the tests):
# brings up a private single-node Slurm on localhost (tests/slurm/local_cluster.sh: munge,
# slurmctld, slurmd from Debian's slurm-wlm), then
#   tests/slurm/test_gpu_scripts.sh   every slurm/*.sh GPU-setup script vs fake GPU nodes (--test-only)
#   tests/slurm/test_smoke_job.sh     2 fsdpq ranks under sbatch/srun: train, preempt+requeue, bad input
#   Cli.UnderSrunRanksComeFromSlurm   the unit test that needs a live Slurm (skipped by make test)
# and stops the daemons on any exit. Each part has a time limit; a failure says which part.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

step() { echo; echo "== ci-slurm: $*"; }

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  step "installing slurm-wlm and munge (Debian packages)"
  if [[ $(id -u) != 0 ]]; then
    echo "ci-slurm: slurm-wlm and munge are not installed and this is not root: apt-get install -y slurm-wlm munge" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  timeout 600 apt-get install -y slurm-wlm munge >/tmp/ci-slurm-apt.log 2>&1 || {
    timeout 300 apt-get update >/dev/null 2>&1 || true
    timeout 600 apt-get install -y slurm-wlm munge >/tmp/ci-slurm-apt.log 2>&1 || {
      tail -n 20 /tmp/ci-slurm-apt.log >&2
      echo "ci-slurm: apt-get install slurm-wlm munge failed" >&2
      exit 1
    }
  }
fi
[[ -x ./fsdpq ]] || { echo "ci-slurm: ./fsdpq is missing: run make (or make test) first" >&2; exit 1; }

source tests/slurm/local_cluster.sh
cleanup() {
  local rc=$?
  ((rc == 0)) || slurm_ci_show_logs
  slurm_down
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

step "starting munged, slurmctld and slurmd on localhost"
slurm_up
srun --mpi=list 2>&1 | grep -q pmix || { echo "ci-slurm: this Slurm has no pmix MPI plugin (srun --mpi=list)" >&2; exit 1; }

step "GPU-setup scripts against the fake GPU nodes"
timeout 600 tests/slurm/test_gpu_scripts.sh || { echo "ci-slurm: tests/slurm/test_gpu_scripts.sh failed" >&2; exit 1; }

step "smoke jobs: 2 ranks of fsdpq through sbatch and srun"
timeout 900 tests/slurm/test_smoke_job.sh || { echo "ci-slurm: tests/slurm/test_smoke_job.sh failed" >&2; exit 1; }

step "unit test that needs a live Slurm"
unit=$root/build/tests/fsdpq_unit_tests
[[ -x $unit ]] || { echo "ci-slurm: $unit is missing: run make test first" >&2; exit 1; }
out=$(cd "$root" && timeout 300 "$unit" --gtest_filter='Cli.UnderSrunRanksComeFromSlurm' 2>&1) || {
  echo "$out" >&2
  echo "ci-slurm: Cli.UnderSrunRanksComeFromSlurm failed" >&2
  exit 1
}
grep -q '\[  PASSED  \] 1 test' <<<"$out" || { echo "$out" >&2; echo "ci-slurm: Cli.UnderSrunRanksComeFromSlurm did not run (skipped?)" >&2; exit 1; }
echo "ok: Cli.UnderSrunRanksComeFromSlurm"

step "all Slurm checks passed"
