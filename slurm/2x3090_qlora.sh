#!/bin/bash
# 2x RTX 3090 (24 GB, PCIe, no NVLink): Llama-2-70B QLoRA at context 2048.
# fsdp_qlora's benchmark report (03/2024): on 24 GB cards 70B only trains with the sharded NF4
# weights offloaded to the CPU (and activations too): batch 2, 14.9 GiB peak per GPU, ~50 s per
# batch. Global batch 2 x 2 x 8 = 32, as the report. The host holds the offloaded model: 120 GB.
# Steps are slow, so USR1 comes 15 minutes before the time limit.
#SBATCH --job-name=fsdpq-2x3090-qlora
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=2
#SBATCH --gres=gpu:rtx3090:2
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
