# shellcheck shell=bash
# The part every slurm/*.sh GPU-setup script shares (sourced, not run): site settings, the fsdpq
# command line, srun, and requeue when fsdpq exits with 75 (checkpoint written after SIGUSR1/SIGTERM,
# src/runtime/exit_codes.h). A setup script holds only its #SBATCH resources and its settings:
#
#   source "${FSDPQ_ROOT:-${SLURM_SUBMIT_DIR:-.}}/slurm/common.sh" || exit 2
#   fsdpq_job inputs/X.ini --batch_size 4 --use_cpu_offload false -- "$@"
#
# Settings win in this order (a later source drops the same key from the earlier ones, so fsdpq never
# sees a key twice): the .ini file < the script's settings < FSDPQ_MODEL / FSDPQ_DATA /
# FSDPQ_DATASET / FSDPQ_TOKENIZER < the script's own arguments (`sbatch slurm/X.sh --max_steps 10`).
#
# Environment (all optional; slurm/site.env, when present, is sourced first and may set them):
#   FSDPQ_ROOT          the fsdpq checkout (default: the folder sbatch was run from)
#   FSDPQ_BIN           the program (default: $FSDPQ_ROOT/fsdpq)
#   FSDPQ_MODULES       environment modules to `module load` before the run
#   FSDPQ_SRUN_MPI      srun's --mpi plugin (default: pmix, what Open MPI 4/5 builds use)
#   FSDPQ_SRUN_ARGS     more srun options, e.g. a container: --container-image=... (pyxis)
#   FSDPQ_RUNS          where run folders go (default: runs); each job writes RUNS/JOBNAME-JOBID
#   FSDPQ_MAX_REQUEUES  how often a job requeues itself after exit 75 (default: 20)
#   FSDPQ_NO_SRUN=1     run one process without srun outside a job (to check a script's settings)

# The exit code that means "checkpoint written, requeue me" (kExitCheckpointed).
FSDPQ_EXIT_CHECKPOINTED=75

fsdpq_log() { echo "fsdpq-slurm: $*" >&2; }

# Sources slurm/site.env (or $FSDPQ_SITE_ENV) when present. Used here and by slurm/submit.sh.
fsdpq_source_site_env() {
  local site=${FSDPQ_SITE_ENV:-$FSDPQ_ROOT/slurm/site.env}
  if [[ -n ${FSDPQ_SITE_ENV:-} && ! -f $FSDPQ_SITE_ENV ]]; then
    fsdpq_log "FSDPQ_SITE_ENV=$FSDPQ_SITE_ENV: no such file"
    return 2
  fi
  if [[ -f $site ]]; then
    # shellcheck disable=SC1090
    source "$site" || { fsdpq_log "$site: sourcing it failed"; return 2; }
  fi
}

# fsdpq_job CONFIG.ini [SETTING...] -- [USER ARG...]
fsdpq_job() {
  local config=$1
  shift
  local -a settings=() user=() env_settings=() command=()
  while (($#)) && [[ $1 != -- ]]; do settings+=("$1"); shift; done
  (($#)) && shift
  user=("$@")

  FSDPQ_ROOT=${FSDPQ_ROOT:-${SLURM_SUBMIT_DIR:-$PWD}}
  cd "$FSDPQ_ROOT" || { fsdpq_log "FSDPQ_ROOT=$FSDPQ_ROOT: cannot enter it"; return 2; }
  fsdpq_source_site_env || return 2
  local bin=${FSDPQ_BIN:-$FSDPQ_ROOT/fsdpq}
  [[ -x $bin ]] || { fsdpq_log "$bin: not an executable (build with \`make\`, or set FSDPQ_BIN)"; return 2; }
  [[ -f $config ]] || { fsdpq_log "$config: no such config file (relative to $FSDPQ_ROOT)"; return 2; }

  if [[ -n ${FSDPQ_MODULES:-} ]]; then
    type module >/dev/null 2>&1 || { fsdpq_log "FSDPQ_MODULES is set but there is no \`module\` command"; return 2; }
    # shellcheck disable=SC2086  # a list of module names
    module load $FSDPQ_MODULES || { fsdpq_log "module load $FSDPQ_MODULES failed"; return 2; }
  fi

  local name=${SLURM_JOB_NAME:-$(basename "$config" .ini)}
  env_settings+=(--output_dir "${FSDPQ_RUNS:-runs}/${name}-${SLURM_JOB_ID:-local}")
  [[ -z ${FSDPQ_MODEL:-} ]] || env_settings+=(--model_name "$FSDPQ_MODEL")
  [[ -z ${FSDPQ_TOKENIZER:-} ]] || env_settings+=(--tokenizer_path "$FSDPQ_TOKENIZER")
  [[ -z ${FSDPQ_DATASET:-} ]] || env_settings+=(--dataset "$FSDPQ_DATASET")
  [[ -z ${FSDPQ_DATA:-} ]] || env_settings+=(--data_path "$FSDPQ_DATA")

  # fsdpq takes the last of a repeated --key: the user's arguments win over the environment's, which
  # win over the script's settings.
  command=("$config" "${settings[@]}" "${env_settings[@]}" "${user[@]}")

  if [[ -z ${SLURM_JOB_ID:-} ]]; then
    [[ ${FSDPQ_NO_SRUN:-0} == 1 ]] || {
      fsdpq_log "not inside a Slurm job: submit with \`sbatch\` or slurm/submit.sh (FSDPQ_NO_SRUN=1 runs one process to check the settings)"
      return 2
    }
    fsdpq_log "one process, no srun: $bin ${command[*]}"
    "$bin" "${command[@]}"
    return
  fi
  fsdpq_run_step "$bin" "${command[@]}"
}

# Runs the job step, waits for it through SIGTERM, and requeues on exit 75.
fsdpq_run_step() {
  local -a srun=(srun "--mpi=${FSDPQ_SRUN_MPI:-pmix}")
  # shellcheck disable=SC2206  # site-given srun options, split on blanks
  [[ -z ${FSDPQ_SRUN_ARGS:-} ]] || srun+=($FSDPQ_SRUN_ARGS)
  fsdpq_log "job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on ${SLURM_JOB_NUM_NODES:-?} node(s), ${SLURM_NTASKS:-?} tasks: ${srun[*]} $*"

  # scancel, preemption and the time limit send SIGTERM to this shell as well as to the ranks: keep
  # waiting for fsdpq to write its checkpoint instead of dying and taking the step with it.
  FSDPQ_TERMINATED=0
  trap 'FSDPQ_TERMINATED=1; fsdpq_log "SIGTERM: waiting for fsdpq to checkpoint and exit"' TERM
  "${srun[@]}" "$@" &
  local pid=$! rc
  while :; do
    wait "$pid"
    rc=$?
    kill -0 "$pid" 2>/dev/null || break
  done
  wait "$pid"
  rc=$?
  trap - TERM

  if ((rc == FSDPQ_EXIT_CHECKPOINTED)); then
    fsdpq_requeue
    return
  fi
  case $rc in
    0) fsdpq_log "fsdpq finished" ;;
    2) fsdpq_log "fsdpq stopped on a bad setting or input (exit 2): its message above names it" ;;
    *) fsdpq_log "fsdpq failed with exit code $rc" ;;
  esac
  return "$rc"
}

# After exit 75: the checkpoint is on disk and `resume = auto` picks it up in the same run folder
# (a requeued job keeps its job id, hence its output_dir).
fsdpq_requeue() {
  local restarts=${SLURM_RESTART_COUNT:-0} max=${FSDPQ_MAX_REQUEUES:-20}
  if ((FSDPQ_TERMINATED)); then
    # SIGTERM reached this shell too: scancel, or preemption (PreemptMode=REQUEUE requeues by
    # itself). Requeueing here would undo a user's scancel.
    fsdpq_log "checkpoint written after SIGTERM: not requeueing (resubmit the same script with --output_dir of this run to continue)"
    return "$FSDPQ_EXIT_CHECKPOINTED"
  fi
  if ((restarts >= max)); then
    fsdpq_log "checkpoint written, but the job was requeued $restarts times already (FSDPQ_MAX_REQUEUES=$max): stopping"
    return "$FSDPQ_EXIT_CHECKPOINTED"
  fi
  fsdpq_log "checkpoint written (exit 75): requeueing job $SLURM_JOB_ID (restart $((restarts + 1)) of at most $max)"
  scontrol requeue "$SLURM_JOB_ID" || {
    fsdpq_log "scontrol requeue $SLURM_JOB_ID failed (is the job submitted with --requeue?)"
    return "$FSDPQ_EXIT_CHECKPOINTED"
  }
  return 0
}
