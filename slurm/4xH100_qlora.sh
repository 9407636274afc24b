#!/bin/bash
# 4x H100 (80 GB SXM): Llama-2-70B QLoRA at context 2048.
# The report: no offload, full_shard, batch 8; here training is compute-bound (batch 12 or LoRA
# instead of QLoRA changed little). Global batch 8 x 4 = 32.
#SBATCH --job-name=fsdpq-4xH100-qlora
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=4
#SBATCH --gres=gpu:h100:4
#SBATCH --cpus-per-task=16
#SBATCH --mem=480G
#SBATCH --time=24:00:00
#SBATCH --signal=USR1@300
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=slurm-%x-%j.out
# Site settings (account, partition, QoS, modules, container): slurm/site.env, see docs/slurm.md.

source "${FSDPQ_ROOT:-${SLURM_SUBMIT_DIR:-.}}/slurm/common.sh" || exit 2
fsdpq_job inputs/llama2-70b_qlora.ini \
  --sharding_strategy full_shard --use_cpu_offload false --use_activation_cpu_offload false \
  --batch_size 8 --gradient_accumulation_steps 1 -- "$@"
