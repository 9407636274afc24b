#!/bin/bash
# Submits a GPU-setup script with this site's settings: sources slurm/site.env (account,
# partition, QoS through sbatch's SBATCH_* variables), rewrites the GPU type of the script's
# --gres with FSDPQ_GRES_MAP, and runs sbatch from the checkout so the job finds slurm/common.sh.
#
#   slurm/submit.sh [SBATCH OPTION...] slurm/4xA100_qlora.sh [FSDPQ SETTING...]
#   e.g. slurm/submit.sh --time=2:00:00 slurm/4xA100_qlora.sh --max_steps 200
set -euo pipefail
export FSDPQ_ROOT=${FSDPQ_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
source "$FSDPQ_ROOT/slurm/common.sh"
fsdpq_source_site_env || exit 2

# sbatch's own options come before the script; the script is the first argument naming a file.
sbatch_args=()
while (($#)) && [[ ! -f $1 ]]; do sbatch_args+=("$1"); shift; done
(($#)) || { echo "usage: slurm/submit.sh [SBATCH OPTION...] SCRIPT.sh [FSDPQ SETTING...]" >&2; exit 2; }
script=$(realpath "$1")
shift

gres=$(sed -n 's/^#SBATCH[[:space:]]\{1,\}--gres=\([^[:space:]]*\).*/\1/p' "$script" | head -n 1)
if [[ -n ${FSDPQ_GRES_MAP:-} && $gres =~ ^gpu:([^:]+):([0-9]+)$ ]]; then
  type=${BASH_REMATCH[1]} count=${BASH_REMATCH[2]}
  for pair in $FSDPQ_GRES_MAP; do
    [[ $pair == *=* ]] || { echo "FSDPQ_GRES_MAP: '$pair' is not TYPE=SITE_TYPE" >&2; exit 2; }
    if [[ ${pair%%=*} == "$type" ]]; then
      site_type=${pair#*=}
      # A command-line --gres wins over the script's #SBATCH line.
      sbatch_args=("--gres=gpu:${site_type:+$site_type:}$count" "${sbatch_args[@]}")
    fi
  done
fi

cd "$FSDPQ_ROOT"
exec sbatch "${sbatch_args[@]}" "$script" "$@"
