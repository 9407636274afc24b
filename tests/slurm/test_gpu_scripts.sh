#!/bin/bash
# Checks every GPU-setup script in slurm/ against the local cluster's fake GPU nodes
# (tests/slurm/local_cluster.sh, partition gpu; SLURM_CONF set):
#   - its #SBATCH lines: nodes, --gres=gpu:TYPE:N with one task per GPU, CPUs, memory, time,
#     --signal=USR1@N, --requeue, and no site-specific account/partition/QoS;
#   - `sbatch --test-only -p gpu`: Slurm accepts the request and would place it on nodes that
#     have that many GPUs of that type (a control request for too many GPUs must be refused);
#   - its fsdpq settings: the script run outside Slurm (FSDPQ_NO_SRUN=1) with --dry_run on the
#     config's model shape as a preset, so fsdpq validates the .ini plus the script's overrides.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
[[ -n ${SLURM_CONF:-} ]] || { echo "FAIL: SLURM_CONF is not set: bring the cluster up first (scripts/ci-slurm.sh)" >&2; exit 1; }
[[ -x ./fsdpq ]] || { echo "FAIL: ./fsdpq is missing: build it first (make)" >&2; exit 1; }
failures=0
work=$(mktemp -d "${TMPDIR:-/tmp}/fsdpq-gpu-scripts.XXXXXX")
trap 'rm -rf "$work"' EXIT
: >"$work/empty.env"  # no site settings: the scripts alone

# The value of `#SBATCH --NAME=VALUE` in a script (empty when absent).
directive() { sed -n "s/^#SBATCH[[:space:]]\{1,\}--$2=\([^[:space:]]*\).*/\1/p" "$1" | head -n 1; }
has_flag() { grep -Eq "^#SBATCH[[:space:]]+--$2([[:space:]]|\$)" "$1"; }

# Runs sbatch --test-only; prints the nodes Slurm would use, or fails with Slurm's words.
test_only() {
  local out
  out=$(timeout 60 sbatch --test-only -p gpu "$@" 2>&1) || { echo "$out"; return 1; }
  sed -n 's/.* on nodes \([^ ]*\) in partition.*/\1/p' <<<"$out"
}

scripts=()
for f in slurm/*.sh; do
  if grep -q "^#SBATCH" "$f"; then scripts+=("$f"); fi
done
((${#scripts[@]} >= 10)) || fail "only ${#scripts[@]} GPU-setup scripts in slurm/"

data_args=()
[[ -f ../shared/data/sql.jsonl ]] || data_args=(--dataset dummy --dataset_samples 64)

for script in "${scripts[@]}"; do
  errors_before=$failures
  nodes=$(directive "$script" nodes)
  tasks=$(directive "$script" ntasks-per-node)
  gres=$(directive "$script" gres)
  [[ $nodes =~ ^[0-9]+$ ]] || fail "$script: no #SBATCH --nodes=N"
  [[ $gres =~ ^gpu:([a-z0-9_]+):([0-9]+)$ ]] || fail "$script: no #SBATCH --gres=gpu:TYPE:N (got '$gres')"
  gpu_type=${BASH_REMATCH[1]:-} gpus=${BASH_REMATCH[2]:-0}
  [[ $tasks == "$gpus" ]] || fail "$script: --ntasks-per-node=$tasks but $gpus GPUs per node (one rank per GPU)"
  [[ -n $(directive "$script" cpus-per-task) ]] || fail "$script: no --cpus-per-task"
  [[ -n $(directive "$script" mem)$(directive "$script" mem-per-cpu) ]] || fail "$script: no --mem or --mem-per-cpu"
  [[ -n $(directive "$script" time) ]] || fail "$script: no --time"
  [[ $(directive "$script" signal) =~ ^(R:)?USR1@[0-9]+$ ]] || fail "$script: no --signal=USR1@SECONDS (fsdpq checkpoints on SIGUSR1)"
  has_flag "$script" requeue || fail "$script: no --requeue (it requeues itself after exit 75)"
  if grep -Eq '^#SBATCH[[:space:]]+(--account|--partition|--qos|-A|-p|-q)' "$script"; then
    fail "$script: account/partition/QoS are site settings (slurm/site.env), not for the script"
  fi
  grep -q 'slurm/common.sh' "$script" || fail "$script: does not source slurm/common.sh"
  config=$(sed -n 's/^fsdpq_job[[:space:]]\{1,\}\([^[:space:]]*\).*/\1/p' "$script")
  [[ -f $config ]] || fail "$script: fsdpq_job's config '$config' does not exist"

  if placed=$(test_only "$script"); then
    # Each node Slurm chose must have at least this many GPUs of this type.
    count=0
    for node in $(scontrol show hostnames "$placed"); do
      count=$((count + 1))
      node_gres=$(scontrol show node "$node" | grep -o 'Gres=[^ ]*' | cut -d= -f2)
      if ! [[ $node_gres =~ ^gpu:${gpu_type}:([0-9]+) ]] || ((BASH_REMATCH[1] < gpus)); then
        fail "$script: placed on $node with Gres=$node_gres, not $gpus x $gpu_type"
      fi
    done
    ((count == nodes)) || fail "$script: placed on $count node(s) ($placed), expected $nodes"
  else
    fail "$script: sbatch --test-only refused it: $placed"
  fi

  # The fsdpq settings: the config's model shape as a random-initialised preset, one process.
  model=$(sed -n 's/^model_name[[:space:]]*=[[:space:]]*//p' "$config")
  log="$work/$(basename "$script" .sh).log"
  if ! FSDPQ_NO_SRUN=1 FSDPQ_RUNS="$work/runs" FSDPQ_SITE_ENV="$work/empty.env" timeout 120 bash "$script" --dry_run \
      --model_name "preset:$(basename "$model")" --tokenizer_path builtin:bytes "${data_args[@]}" >"$log" 2>&1; then
    cat "$log" >&2
    fail "$script: fsdpq --dry_run rejected its settings"
  elif ! grep -q 'dry run: everything checked' "$log"; then
    cat "$log" >&2
    fail "$script: fsdpq --dry_run did not finish its checks"
  fi
  ((failures == errors_before)) && echo "ok: $script → ${placed} ($nodes x $gpus $gpu_type), settings checked"
done

# Control: the checks must be able to fail. One GPU more per node than any fake node has is refused.
cp slurm/8xH100_qlora.sh "$work/too_many_gpus.sh"
sed -i 's/^#SBATCH --gres=gpu:h100:8/#SBATCH --gres=gpu:h100:9/; s/^#SBATCH --ntasks-per-node=8/#SBATCH --ntasks-per-node=9/' "$work/too_many_gpus.sh"
if out=$(test_only "$work/too_many_gpus.sh"); then
  fail "control: sbatch --test-only accepted 9 H100s on one node ($out): the fake cluster checks nothing"
else
  echo "ok: control request for 9 x h100 per node refused ($out)"
fi

# slurm/submit.sh applies a site.env: its SBATCH_PARTITION, and FSDPQ_GRES_MAP renaming the GPU type
# (h100 → a100 here, so the 4xH100 script must land on the fake A100 node).
printf 'export SBATCH_PARTITION=gpu\nFSDPQ_GRES_MAP="h100=a100"\n' >"$work/site.env"
if out=$(FSDPQ_SITE_ENV="$work/site.env" timeout 60 slurm/submit.sh --test-only slurm/4xH100_qlora.sh 2>&1) \
    && [[ $out == *"on nodes fake-4xa100 in partition gpu"* ]]; then
  echo "ok: slurm/submit.sh with a site.env: partition and GPU type map applied"
else
  fail "slurm/submit.sh did not apply site.env (SBATCH_PARTITION, FSDPQ_GRES_MAP h100=a100): $out"
fi

if ((failures)); then
  echo "test_gpu_scripts: $failures failure(s)" >&2
  exit 1
fi
echo "test_gpu_scripts: all ${#scripts[@]} GPU-setup scripts pass"
