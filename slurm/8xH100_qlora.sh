#!/bin/bash
# 8x H100 (80 GB SXM, a whole node): Llama-2-70B QLoRA at context 2048.
# As 4x H100 (no offload, full_shard, batch 8 per GPU: compute-bound, so the per-GPU batch stays);
# global batch 8 x 8 = 64. The node is taken whole (--exclusive, --mem=0).
#SBATCH --job-name=fsdpq-8xH100-qlora
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=8
#SBATCH --gres=gpu:h100:8
#SBATCH --cpus-per-task=14
#SBATCH --mem=0
#SBATCH --exclusive
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
