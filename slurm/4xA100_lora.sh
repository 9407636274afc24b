#!/bin/bash
# 4x A100 (40 GB): Llama-2-7B LoRA (bf16 base) at context 2048.
# The report's first lesson: when the weights do not dominate the memory (7B in bf16 is 13.5 GB),
# DDP beats sharding, which only adds gathers. On 24 GB it ran LoRA DDP at batch 4 (22 GiB);
# 40 GB takes batch 8. Global batch 8 x 4 = 32.
#SBATCH --job-name=fsdpq-4xA100-lora
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
fsdpq_job inputs/llama2-7b_lora.ini \
  --sharding_strategy ddp --use_cpu_offload false --use_gradient_checkpointing true \
  --batch_size 8 --gradient_accumulation_steps 1 -- "$@"
