#!/bin/bash
# 2x RTX 4090 (24 GB, PCIe 4 x16): Llama-2-70B QLoRA at context 2048.
# The report's dual-4090 workstation: as on 3090s, 70B needs CPU offload of the sharded weights
# and activations, batch 2 (14.9 GiB peak per GPU), about 2.7x the 3090 speed thanks to full x16
# lanes. Global batch 2 x 2 x 8 = 32. USR1 15 minutes before the limit (slow steps).
#SBATCH --job-name=fsdpq-2x4090-qlora
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=2
#SBATCH --gres=gpu:rtx4090:2
#SBATCH --cpus-per-task=8
#SBATCH --mem=120G
#SBATCH --time=24:00:00
#SBATCH --signal=USR1@900
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=slurm-%x-%j.out
# Site settings (account, partition, QoS, modules, container): slurm/site.env, see docs/slurm.md.

source "${FSDPQ_ROOT:-${SLURM_SUBMIT_DIR:-.}}/slurm/common.sh" || exit 2
fsdpq_job inputs/llama2-70b_qlora.ini \
  --sharding_strategy full_shard --use_cpu_offload true --use_activation_cpu_offload true \
  --batch_size 2 --gradient_accumulation_steps 8 -- "$@"
