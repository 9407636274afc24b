#!/usr/bin/env bash
# fsdpq's settings at one checkpointing point against HF + PEFT torch.compile, in one call: the peer
# runs once, then each fsdpq setting on a copy of its record (bench.py --resume), every one fitted
# under the peer's measured peak (--fsdpq-memory-of: the plan picks keep_activation_layers and
# keep_dequantized_layers for that setting). ~45 s for the peer, ~30 s a setting at 7B ctx 2048 bs 8.
# Prepare here:
#   ../shared/device/bundle-libs.sh build/fsdpq .device/lib &&
#   bash scripts/device_pack.sh .device/lib build/fsdpq
# Run there with carry [".device/pack.tar.xz"]:
#   tar xJf .device/pack.tar.xz && bash scripts/device_checkpointing_settings.sh
# Settings: SETTINGS (one fsdpq flag set a line; an empty line: fsdpq's defaults; a line beginning
# with @PATH runs the binary at PATH, e.g. a baseline's, instead of FSDPQ), POINT (bench.py's shape,
# context and batch flags), FSDPQ (the binary, default build/fsdpq), GRAD_CKPT (off: the same without
# checkpointing).
export LD_LIBRARY_PATH=$PWD/.device/lib:${LD_LIBRARY_PATH:-}
FSDPQ=${FSDPQ:-build/fsdpq}
POINT=${POINT:---shapes llama2-7b --ctx 2048 --bs 8}
SETTINGS=${SETTINGS:-"--use_activation_cpu_offload true
--use_activation_cpu_offload true --recompute_elementwise true
@scripts/fsdpq_nondeterministic_attention.sh --use_activation_cpu_offload true --recompute_elementwise true"}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; date +%T
common="$POINT --grad-ckpt ${GRAD_CKPT:-on} --fsdpq-memory-of hf_lora_compile"
python3 bench/bench.py --peers hf_lora_compile $common --results $OUT/peer.jsonl --log $OUT/peer.log 2>&1 |
  grep -E "tok/s|OOM|error"
i=0
while IFS= read -r args; do
  binary=$FSDPQ
  if [[ $args == @* ]]; then
    binary=${args%% *}; binary=${binary#@}
    [[ $args == *" "* ]] && args=${args#* } || args=""
  fi
  cp $OUT/peer.jsonl $OUT/setting$i.jsonl
  python3 bench/bench.py --peers hf_lora_compile,fsdpq_qlora $common --fsdpq "$binary" --fsdpq-args "$args" --resume \
    --results $OUT/setting$i.jsonl --log $OUT/setting$i.log 2>&1 | grep -E "qlora.*(tok/s|OOM|error|skip)"
  echo "  (setting $i: $binary ${args:-defaults}) $(date +%T)"
  i=$((i + 1))
done <<< "$SETTINGS"
for f in $OUT/setting*.jsonl; do python3 bench/compare.py "$f" 2>&1 | grep -E "fsdpq_qlora"; done
