#!/bin/bash
# 4x RTX A6000 / A6000 Ada (48 GB): Llama-2-70B QLoRA at context 2048.
# The report: no offload needed on 48 GB, full_shard with batch 3 was the fastest; global batch
# 3 x 4 x 3 = 36, the closest to the report's 32.
#SBATCH --job-name=fsdpq-4xA6000-qlora
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=4
#SBATCH --gres=gpu:a6000:4
#SBATCH --cpus-per-task=16
#SBATCH --mem=240G
#SBATCH --time=24:00:00
#SBATCH --signal=USR1@300
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=slurm-%x-%j.out
# Site settings (account, partition, QoS, modules, container): slurm/site.env, see docs/slurm.md.

source "${FSDPQ_ROOT:-${SLURM_SUBMIT_DIR:-.}}/slurm/common.sh" || exit 2
fsdpq_job inputs/llama2-70b_qlora.ini \
  --sharding_strategy full_shard --use_cpu_offload false --use_activation_cpu_offload false \
  --batch_size 3 --gradient_accumulation_steps 3 -- "$@"
