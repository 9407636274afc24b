#!/bin/bash
# The CI smoke job (tests/slurm/test_smoke_job.sh submits it): 2 CPU ranks of fsdpq on the demo's
# tiny model, launched by slurm/common.sh exactly as the GPU-setup scripts launch theirs (site.env,
# srun --mpi, run folder, requeue on exit 75). Model and data come from FSDPQ_MODEL / FSDPQ_DATA.
#SBATCH --job-name=fsdpq-ci-smoke
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=2
#SBATCH --cpus-per-task=1
#SBATCH --mem-per-cpu=2G
#SBATCH --time=00:10:00
#SBATCH --signal=USR1@60
#SBATCH --requeue
#SBATCH --open-mode=append

# Test hook: a fault injected into the first run only (its requeued run must go through).
if [[ -n ${FSDPQ_SMOKE_FIRST_RUN_FAULT:-} && ${SLURM_RESTART_COUNT:-0} == 0 ]]; then
  export FSDPQ_INJECT_FAULT=$FSDPQ_SMOKE_FIRST_RUN_FAULT
fi
source "${FSDPQ_ROOT:-${SLURM_SUBMIT_DIR:-.}}/slurm/common.sh" || exit 2
fsdpq_job inputs/demo.ini --save_model false --resume auto -- "$@"
