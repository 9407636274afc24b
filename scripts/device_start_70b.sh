#!/usr/bin/env bash
# One device call for issue #25's 70B point: how long a Llama-2-70B-shape model takes to be ready
# (random init, then quantisation on the GPU layer by layer) for hqq_lora (4 bits) and, beside it,
# qlora (NF4), plus two short steps each. Prepare here: make build;
#   ../shared/device/bundle-libs.sh build/fsdpq .device/lib; scripts/device_pack.sh build/fsdpq .device/lib
# Run there with carry [".device/pack.tar.xz"]:
#   tar xJf .device/pack.tar.xz && bash scripts/device_start_70b.sh   (TYPES="hqq_lora qlora", FSDPQ=path)
export LD_LIBRARY_PATH=$PWD/.device/lib:${LD_LIBRARY_PATH:-}
B=${FSDPQ:-$PWD/build/fsdpq}; W=$(mktemp -d)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
for type in ${TYPES:-hqq_lora qlora}; do
  t0=$(date +%s); timeout ${LIMIT:-280} $B --model_name preset:llama2-70b --tokenizer_path builtin:bytes --train_type $type \
    --n_bits 4 --dataset dummy --dataset_samples 8 --context_length 512 --pad_to_context_length true --batch_size 1 \
    --max_steps 2 --lora_rank 64 --lora_alpha 16 --lora_dropout 0.1 --use_gradient_checkpointing true --log_to stdout \
    --output_dir $W/$type > $OUT/start70b_$type.log 2>&1
  echo "$type rc=$? in $(( $(date +%s) - t0 )) s"
  grep -E "model ready|frozen weights|quantis|solver|step 2" $OUT/start70b_$type.log | cut -c1-220 | head -8
done
