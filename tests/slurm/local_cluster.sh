# shellcheck shell=bash
# A private single-node Slurm cluster on localhost, for CI (source this file, then slurm_up).
#
# Everything lives in one temporary folder: munge key and socket, slurm.conf, state, spool, logs,
# pid files. The daemons listen on ports picked free at start-up, so a Slurm or munge already on the
# machine is neither used nor disturbed. Runs as root (a container): SlurmUser/SlurmdUser root,
# proctrack/linuxproc, task/none and no accounting, so no cgroups or systemd are needed.
#
# The cluster has two partitions:
#   local  (default): this machine, as `slurmd -C` describes it; jobs really run here.
#   gpu:   fake GPU nodes shaped like the machines of fsdp_qlora's benchmark report, declared as
#          powered-down cloud nodes (State=CLOUD, no slurmd behind them). `sbatch --test-only -p gpu`
#          checks a GPU-setup script's request (nodes, GPUs by type, tasks, CPUs, memory, time)
#          against them and names the nodes it would get. Nothing is ever started there.
#          Why CLOUD: --test-only only considers nodes the scheduler may use now; FUTURE nodes
#          are ignored and DOWN ones are left out ("Requested node configuration is not
#          available" for every request), while a powered-down cloud node counts as available.
#
# After slurm_up: SLURM_CONF points at the config; sinfo/sbatch/srun talk to this cluster only.

SLURM_CI_DIR=""
SLURM_CI_PIDS=()

slurm_ci_fail() { echo "ci-slurm: $*" >&2; return 1; }

# A TCP port nothing listens on (nor connects from), from 20000–59999.
slurm_ci_free_port() {
  local port
  for _ in $(seq 1 50); do
    port=$((20000 + RANDOM % 40000))
    if ! ss -Htan | awk '{print $4}' | grep -q ":${port}\$"; then
      echo "$port"
      return 0
    fi
  done
  slurm_ci_fail "no free TCP port found for the Slurm daemons"
}

# The fake GPU nodes: name, CPUs, memory (MB), GRES. Sizes are those of common machines with these
# GPUs (the report's 4xA6000 box had 128 CPUs / 472 GB; DGX A100: 128 cores / 1 TB; DGX H100:
# 112 cores / 2 TB), so a script that asks for more than such a machine has fails the check.
slurm_ci_fake_gpu_nodes() {
  cat <<'EOF'
NodeName=fake-2x3090      CPUs=16  RealMemory=128000  Gres=gpu:rtx3090:2 State=CLOUD
NodeName=fake-2x4090      CPUs=16  RealMemory=128000  Gres=gpu:rtx4090:2 State=CLOUD
NodeName=fake-4xa5000     CPUs=32  RealMemory=256000  Gres=gpu:a5000:4   State=CLOUD
NodeName=fake-4xa6000     CPUs=128 RealMemory=472000  Gres=gpu:a6000:4   State=CLOUD
NodeName=fake-4xa100      CPUs=64  RealMemory=500000  Gres=gpu:a100:4    State=CLOUD
NodeName=fake-8xa100      CPUs=128 RealMemory=1000000 Gres=gpu:a100:8    State=CLOUD
NodeName=fake-4xh100      CPUs=64  RealMemory=1000000 Gres=gpu:h100:4    State=CLOUD
NodeName=fake-8xh100-[1-2] CPUs=112 RealMemory=2000000 Gres=gpu:h100:8   State=CLOUD
EOF
}

slurm_ci_write_conf() {
  local dir=$1 host=$2 ctld_port=$3 slurmd_port=$4 node_line
  # `slurmd -C` prints this machine's NodeName/CPUs/sockets/RealMemory line (and an UpTime line).
  node_line=$(slurmd -C | grep '^NodeName=') || slurm_ci_fail "slurmd -C did not describe this machine"
  # Leave 1 GB of memory to the system, or slurmd sees less than configured and drains the node.
  node_line=$(echo "$node_line" | awk '{for (i = 1; i <= NF; i++) if ($i ~ /^RealMemory=/) { split($i, kv, "="); $i = "RealMemory=" (kv[2] > 2048 ? kv[2] - 1024 : kv[2]) } print}')
  cat >"$dir/slurm.conf" <<EOF
# Written by tests/slurm/local_cluster.sh for one CI run.
ClusterName=fsdpqci
SlurmctldHost=${host}(127.0.0.1)
SlurmctldPort=${ctld_port}
SlurmdPort=${slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=${dir}/munge/munge.socket
StateSaveLocation=${dir}/ctld
SlurmdSpoolDir=${dir}/slurmd
SlurmctldPidFile=${dir}/slurmctld.pid
SlurmdPidFile=${dir}/slurmd.pid
SlurmctldLogFile=${dir}/slurmctld.log
SlurmdLogFile=${dir}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
MpiDefault=none
ReturnToService=2
SlurmdTimeout=60
KillWait=10
# The default 300 s would keep a finished test job "completing" for long after a failure.
UnkillableStepTimeout=60
# Power saving only so that the CLOUD nodes count as available; the local node is never suspended
# and the programs do nothing because no job is ever started on a cloud node.
SuspendProgram=/bin/true
ResumeProgram=/bin/true
SuspendTime=3600
SuspendExcParts=local
# Show the powered-down cloud nodes to scontrol/sinfo (hidden by default), for the test to read.
PrivateData=cloud
${node_line} State=UNKNOWN
$(slurm_ci_fake_gpu_nodes)
PartitionName=local Nodes=${host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
PartitionName=gpu Nodes=fake-2x3090,fake-2x4090,fake-4xa5000,fake-4xa6000,fake-4xa100,fake-8xa100,fake-4xh100,fake-8xh100-[1-2] MaxTime=INFINITE State=UP
EOF
}

# Wait up to $2 seconds for command $1 (a string) to succeed.
slurm_ci_wait_for() {
  local what=$1 seconds=$2
  for _ in $(seq 1 "$seconds"); do
    if eval "$what" >/dev/null 2>&1; then return 0; fi
    sleep 1
  done
  return 1
}

slurm_ci_show_logs() {
  local f
  for f in "$SLURM_CI_DIR"/munge/munged.log "$SLURM_CI_DIR"/slurmctld.log "$SLURM_CI_DIR"/slurmd.log; do
    [[ -f $f ]] || continue
    echo "---- last lines of $f" >&2
    tail -n 30 "$f" >&2
  done
}

slurm_up() {
  local host ctld_port slurmd_port
  for cmd in munged slurmctld slurmd sbatch srun sinfo ss; do
    command -v "$cmd" >/dev/null || { slurm_ci_fail "'$cmd' not found: install Debian's slurm-wlm and munge"; return 1; }
  done
  host=$(hostname -s)
  SLURM_CI_DIR=$(mktemp -d "${TMPDIR:-/tmp}/fsdpq-slurm.XXXXXX")
  chmod 700 "$SLURM_CI_DIR"
  mkdir -p "$SLURM_CI_DIR"/{munge,ctld,slurmd}
  chmod 700 "$SLURM_CI_DIR/munge"

  # munged insists that its key is private and its folders are not writable by others.
  dd if=/dev/urandom of="$SLURM_CI_DIR/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$SLURM_CI_DIR/munge/munge.key"
  munged --force --socket="$SLURM_CI_DIR/munge/munge.socket" \
    --key-file="$SLURM_CI_DIR/munge/munge.key" --pid-file="$SLURM_CI_DIR/munge/munged.pid" \
    --log-file="$SLURM_CI_DIR/munge/munged.log" --seed-file="$SLURM_CI_DIR/munge/munged.seed" \
    || { slurm_ci_show_logs; slurm_ci_fail "munged did not start"; return 1; }
  SLURM_CI_PIDS+=("$(cat "$SLURM_CI_DIR/munge/munged.pid")")
  slurm_ci_wait_for "munge --socket='$SLURM_CI_DIR/munge/munge.socket' -n </dev/null" 10 \
    || { slurm_ci_show_logs; slurm_ci_fail "munged does not answer on its socket"; return 1; }

  ctld_port=$(slurm_ci_free_port) || return 1
  slurmd_port=$(slurm_ci_free_port) || return 1
  [[ $ctld_port != "$slurmd_port" ]] || slurmd_port=$((ctld_port + 1))
  slurm_ci_write_conf "$SLURM_CI_DIR" "$host" "$ctld_port" "$slurmd_port" || return 1
  export SLURM_CONF="$SLURM_CI_DIR/slurm.conf"

  # -i: ignore any saved state (the folder is new anyway).
  slurmctld -i -f "$SLURM_CONF" || { slurm_ci_show_logs; slurm_ci_fail "slurmctld did not start"; return 1; }
  slurm_ci_wait_for "test -s '$SLURM_CI_DIR/slurmctld.pid'" 20 \
    || { slurm_ci_show_logs; slurm_ci_fail "slurmctld wrote no pid file"; return 1; }
  SLURM_CI_PIDS+=("$(cat "$SLURM_CI_DIR/slurmctld.pid")")
  slurm_ci_wait_for "scontrol ping | grep -q UP" 30 \
    || { slurm_ci_show_logs; slurm_ci_fail "slurmctld does not answer (scontrol ping)"; return 1; }

  slurmd -f "$SLURM_CONF" -N "$host" || { slurm_ci_show_logs; slurm_ci_fail "slurmd did not start"; return 1; }
  slurm_ci_wait_for "test -s '$SLURM_CI_DIR/slurmd.pid'" 20 \
    || { slurm_ci_show_logs; slurm_ci_fail "slurmd wrote no pid file"; return 1; }
  SLURM_CI_PIDS+=("$(cat "$SLURM_CI_DIR/slurmd.pid")")
  slurm_ci_wait_for "sinfo -h -p local -N -o '%t' | grep -qE '^(idle|mix|alloc)'" 60 || {
    sinfo -N -l >&2 || true
    slurm_ci_show_logs
    slurm_ci_fail "node $host did not become idle in partition local"
    return 1
  }
  echo "ci-slurm: cluster up in $SLURM_CI_DIR (slurmctld port $ctld_port, slurmd port $slurmd_port)"
}

# Stops the daemons this file started (by pid, newest first) and removes the folder.
# FSDPQ_SLURM_KEEP=1 keeps the folder (logs) for a look after a failure.
slurm_down() {
  local i pid jobs
  # Jobs first, so no slurmstepd (and no fsdpq rank) outlives the daemons.
  if ((${#SLURM_CI_PIDS[@]})) && jobs=$(timeout 10 squeue -h -o %i 2>/dev/null) && [[ -n $jobs ]]; then
    # shellcheck disable=SC2086
    timeout 10 scancel $jobs 2>/dev/null || true
    slurm_ci_wait_for "test -z \"\$(squeue -h -o %i)\"" 30 || echo "ci-slurm: jobs still listed after scancel: $jobs" >&2
  fi
  for ((i = ${#SLURM_CI_PIDS[@]} - 1; i >= 0; i--)); do
    pid=${SLURM_CI_PIDS[i]}
    kill "$pid" 2>/dev/null || continue
    for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$pid" 2>/dev/null || true
  done
  SLURM_CI_PIDS=()
  if [[ -n $SLURM_CI_DIR && -d $SLURM_CI_DIR ]]; then
    if [[ ${FSDPQ_SLURM_KEEP:-0} == 1 ]]; then
      echo "ci-slurm: kept $SLURM_CI_DIR"
    else
      rm -rf "$SLURM_CI_DIR"
    fi
  fi
}
