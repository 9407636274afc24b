#!/bin/bash
# 4x A100 (40 GB SXM; 80 GB cards take it as is): Llama-2-70B QLoRA at context 2048.
# The report: no offload, full_shard, batch 4 (its cheapest 70B setup); global batch
# 4 x 4 x 2 = 32. On 80 GB cards a larger --batch_size fits.
#SBATCH --job-name=fsdpq-4xA100-qlora
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=4
#SBATCH --gres=gpu:a100:4
#SBATCH --cpus-per-task=16
#SBATCH --mem=320G
#SBATCH --time=24:00:00
#SBATCH --signal=USR1@300
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=slurm-%x-%j.out
# Site settings (account, partition, QoS, modules, container): slurm/site.env, see docs/slurm.md.

source "${FSDPQ_ROOT:-${SLURM_SUBMIT_DIR:-.}}/slurm/common.sh" || exit 2
fsdpq_job inputs/llama2-70b_qlora.ini \
  --sharding_strategy full_shard --use_cpu_offload false --use_activation_cpu_offload false \
  --batch_size 4 --gradient_accumulation_steps 2 -- "$@"
