#!/bin/bash
# 2 nodes x 8 H100 (80 GB): Llama-2-70B QLoRA at context 2048 with hybrid sharding.
# hybrid_full_shard shards within a node (NVLink) and replicates across nodes, so only gradients
# cross the slower inter-node network (the report's HYBRID_SHARD advice for multi-node runs).
# Batch 8 per GPU as on one H100 node; global batch 8 x 16 = 128.
#SBATCH --job-name=fsdpq-2node-8xH100-hybrid
#SBATCH --nodes=2
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
  --sharding_strategy hybrid_full_shard --use_cpu_offload false --use_activation_cpu_offload false \
  --batch_size 8 --gradient_accumulation_steps 1 -- "$@"
