#!/bin/bash
# 4x RTX A5000 (24 GB): Llama-2-70B QLoRA at context 2048.
# The report: with 4 (or 8) A5000s the weights fit sharded and CPU offload was slower even with
# twice the batch, because GPU-to-GPU copies beat host-to-GPU ones there. So: full_shard, no
# offload, batch 1, global batch 1 x 4 x 8 = 32.
#SBATCH --job-name=fsdpq-4xA5000-qlora
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=4
#SBATCH --gres=gpu:a5000:4
#SBATCH --cpus-per-task=8
#SBATCH --mem=200G
#SBATCH --time=24:00:00
#SBATCH --signal=USR1@600
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=slurm-%x-%j.out
# Site settings (account, partition, QoS, modules, container): slurm/site.env, see docs/slurm.md.

source "${FSDPQ_ROOT:-${SLURM_SUBMIT_DIR:-.}}/slurm/common.sh" || exit 2
fsdpq_job inputs/llama2-70b_qlora.ini \
  --sharding_strategy full_shard --use_cpu_offload false --use_activation_cpu_offload false \
  --batch_size 1 --gradient_accumulation_steps 8 -- "$@"
