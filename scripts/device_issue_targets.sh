#!/usr/bin/env bash
# The measurements issues #22 and #24 set their targets by, on whatever GPU the call got (the
# targets are the H200's; record which card it was). PART=attention (~2 min): fsdpq's attention
# routes beside PyTorch's SDPA backends at B·T 16k, H 32, D 128 (T 512, 2048, 8192, GQA 32/8).
# PART=step (~9.5 min; or PART=step-off, ~6.5 min, then PART=step-on, ~3.5 min, where a call's 10
# minutes are short): the 7B QLoRA step at ctx 2048 against HF + PEFT torch.compile, no
# checkpointing at bs 4 and 8 and checkpointing at bs 8, fsdpq keeping as many dense layers as fit
# under the peer's measured peak at each point (bench.py --fsdpq-memory-of), then compare.py. With
# checkpointing fsdpq runs its fastest setting there, activation offload with recompute_elementwise
# (bench/RESULTS.md, stop 45). PART=targets (~9.5 min): the attention table and the two rows #24's
# targets name (bs 4 without checkpointing, bs 8 with), for a call on a card that comes seldom.
# Prepare here:
#   ../shared/device/bundle-libs.sh build/fsdpq build/tests/fsdpq_gpu_tests .device/lib &&
#   bash scripts/device_pack.sh .device/lib build/fsdpq build/tests/fsdpq_gpu_tests
# Run there with carry [".device/pack.tar.xz"]:
#   tar xJf .device/pack.tar.xz && PART=attention bash scripts/device_issue_targets.sh
#   tar xJf .device/pack.tar.xz && PART=step bash scripts/device_issue_targets.sh   (or step-off, then step-on)
export LD_LIBRARY_PATH=$PWD/.device/lib:${LD_LIBRARY_PATH:-}
date; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
case "${PART:-}" in
  attention)
    FSDPQ_GPU_PERF=1 timeout 150 build/tests/fsdpq_gpu_tests --gtest_filter='GpuOpsAttentionCudnn.Perf' 2>&1 |
      grep -E "^PERF" | tee $OUT/attention_fsdpq.txt
    timeout 150 python3 bench/attention_torch.py 2>&1 | grep -E "^PERF" | tee $OUT/attention_torch.txt
    ;;
  step|step-off|step-on)
    # (fsdpq_lora: the bf16-base point beside the NF4 one. Split in two calls, each part's results come
    # back in its own targets.jsonl: run bench/compare.py on both here.)
    [ "$PART" != step-on ] && timeout 370 python3 bench/bench.py --peers hf_lora_compile,fsdpq_qlora,fsdpq_lora --fsdpq build/fsdpq \
      --fsdpq-memory-of hf_lora_compile --shapes llama2-7b --ctx 2048 --grad-ckpt off --bs 4,8 --budget 360 \
      --results $OUT/targets.jsonl --log $OUT/bench.log 2>&1 | grep -E "tok/s|OOM|error|skip"
    [ "$PART" != step-off ] && timeout 190 python3 bench/bench.py --peers hf_lora_compile,fsdpq_qlora,fsdpq_lora --fsdpq build/fsdpq \
      --fsdpq-memory-of hf_lora_compile --shapes llama2-7b --ctx 2048 --grad-ckpt on --bs 8 --budget 180 \
      --fsdpq-args "--use_activation_cpu_offload true --recompute_elementwise true" \
      --results $OUT/targets.jsonl --log $OUT/bench.log 2>&1 | grep -E "tok/s|OOM|error|skip"
    python3 bench/compare.py $OUT/targets.jsonl
    ;;
  targets)
    # Everything the two issues' targets need in one 10-minute call (~9.5 min: each part starts
    # only while the call has time for it): the attention table, then #24's two rows at bs 8 with
    # checkpointing and bs 4 without, the peer at each (the bf16-base point and bs 8 without
    # checkpointing left to PART=step).
    started=$(date +%s); left() { echo $(( 570 - ($(date +%s) - started) )); }
    PART=attention timeout 150 bash "$0"
    [ $(left) -gt 250 ] && timeout 245 python3 bench/bench.py --peers hf_lora_compile,fsdpq_qlora --fsdpq build/fsdpq \
      --fsdpq-memory-of hf_lora_compile --shapes llama2-7b --ctx 2048 --grad-ckpt off --bs 4 --budget 240 \
      --results $OUT/targets.jsonl --log $OUT/bench.log 2>&1 | grep -E "tok/s|OOM|error|skip"
    [ $(left) -gt 150 ] && timeout $(( $(left) - 5 )) python3 bench/bench.py --peers hf_lora_compile,fsdpq_qlora \
      --fsdpq build/fsdpq --fsdpq-memory-of hf_lora_compile --shapes llama2-7b --ctx 2048 --grad-ckpt on --bs 8 \
      --budget $(( $(left) - 10 )) --fsdpq-args "--use_activation_cpu_offload true --recompute_elementwise true" \
      --results $OUT/targets.jsonl --log $OUT/bench.log 2>&1 | grep -E "tok/s|OOM|error|skip"
    python3 bench/compare.py $OUT/targets.jsonl
    ;;
  *)
    echo "set PART=attention, step, step-off, step-on or targets" >&2
    exit 2
    ;;
esac
date
