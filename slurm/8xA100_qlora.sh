#!/bin/bash
# 8x A100 (40 GB SXM, a whole DGX-class node): Llama-2-70B QLoRA at context 2048.
# The report: no offload, full_shard, batch 4, twice as fast as 4 GPUs; global batch
# 4 x 8 = 32. The node is taken whole (--exclusive, --mem=0: all its memory).
#SBATCH --job-name=fsdpq-8xA100-qlora
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=8
#SBATCH --gres=gpu:a100:8
#SBATCH --cpus-per-task=16
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
  --batch_size 4 --gradient_accumulation_steps 1 -- "$@"
