#!/usr/bin/env bash
# The planner's predictions for the multi-GPU setups of issue #7 (docs/planner.md's table):
# QLoRA r 64, context 2048, H200-sized GPUs, batch 4, every strategy with and without CPU offload.
#   bash scripts/planner_table.sh > /tmp/rows.md
set -euo pipefail
B=${FSDPQ:-./fsdpq}
for m in 7b 70b; do
  for g in 1 2 4 8; do
    for s in full_shard shard_grad_op ddp hybrid_full_shard; do
      [ "$s" = hybrid_full_shard ] && [ "$g" -lt 2 ] && continue
      for o in false true; do
        [ "$s" = ddp ] && [ "$o" = true ] && continue
        extra=(); [ "$s" = hybrid_full_shard ] && extra=(--ranks_per_node $((g / 2)))
        out=$($B plan inputs/dummy_$m.ini --gpus $g --gpu-mem 141 --sharding_strategy $s --use_cpu_offload $o \
              --batch_size 4 "${extra[@]}" 2>&1)
        peak=$(awk -F'|' '/\*\*peak allocated\*\*/ {gsub(/ /, "", $3); print $3; exit}' <<< "$out")
        need=$(awk -F'|' '/\*\*needed per GPU\*\*/ {gsub(/ /, "", $3); print $3; exit}' <<< "$out")
        host=$(awk -F'|' '/\*\*host peak per rank/ {gsub(/^ +| +$/, "", $4); print $4; exit}' <<< "$out")
        echo "| $m | $g | $s | $o |  $peak  |  $need  |  $host  |"
      done
    done
  done
done
