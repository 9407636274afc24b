#!/usr/bin/env bash
# One device call for Llama-Pro (docs/llama_pro.md): the GPU tests against the CPU backend,
# bnb_llama_pro / hqq_llama_pro training on the GPU (first loss the base's to the bit, falling
# loss, 1 vs 2 ranks, CPU offload), and the 7B shape's tokens/s and peak memory for bnb_llama_pro
# (LLaMA-Pro-8B's 8 new blocks) next to qlora, each beside what `fsdpq plan` predicts. The demo
# runs take seconds; the two 7B runs (200 s limit each) take most of the call.
# Prepare here: make build; build/fsdpq demo --out .device/demo --dry_run;
#   ../shared/device/bundle-libs.sh build/fsdpq build/tests/fsdpq_gpu_tests .device/lib
# Run there with carry [".device", "build/fsdpq", "build/tests/fsdpq_gpu_tests"]:
#   bash scripts/device_llama_pro.sh
export LD_LIBRARY_PATH=$PWD/.device/lib:$LD_LIBRARY_PATH
ROOT=$PWD; B=$ROOT/build/fsdpq; D=$ROOT/.device/demo; W=$(mktemp -d)
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader

echo "== GPU tests: GpuLlamaPro.* (and GpuModel.* beside it)"
timeout 200 build/tests/fsdpq_gpu_tests --gtest_filter='GpuLlamaPro.*:GpuModel.*' > "$OUT/gpu_tests.log" 2>&1
echo "rc=$?"; grep -E "loss cpu|^\[  (PASSED|FAILED) |^\[  FAILED  \]|Failure" "$OUT/gpu_tests.log" | head -30

# A short demo run: $1 its name, then the command (the binary, "${DEMO[@]}", its own flags: the
# last of a repeated flag wins).
DEMO=(--model_name "$D/model" --dataset alpaca --data_path "$D/data.jsonl" --batch_size 8 --context_length 256
      --lora_rank 16 --lora_alpha 32 --lora_dropout 0 --lr 1e-2 --max_steps 30 --log_to stdout)
demo() {
  local name=$1; shift
  timeout 120 "$@" --output_dir "$W/$name" > "$OUT/$name.log" 2>&1
  echo "$name rc=$?: $(grep -E '^trained' "$OUT/$name.log")"
  cp "$W/$name/metrics.jsonl" "$OUT/$name.metrics.jsonl" 2>/dev/null
}
echo "== demo model on the GPU: the Llama-Pro types, qlora / hqq_lora for their first loss, 2 ranks, CPU offload"
demo pro_bnb "$B" "${DEMO[@]}" --train_type bnb_llama_pro --llama_pro_num_new_blocks 2
demo pro_hqq "$B" "${DEMO[@]}" --train_type hqq_llama_pro --llama_pro_num_new_blocks 1 --n_bits 4
demo base_qlora "$B" "${DEMO[@]}" --train_type qlora
demo base_hqq "$B" "${DEMO[@]}" --train_type hqq_lora --n_bits 4
demo pro_bnb_offload "$B" "${DEMO[@]}" --train_type bnb_llama_pro --llama_pro_num_new_blocks 2 --use_cpu_offload true
# The same 8 examples a step, one per micro-batch, on 1 rank and on 2 sharing the GPU (as the
# Equivalence tests: fsdp_qlora's loss averages micro-batch means, so the grouping must match).
demo pro_bnb_bs1 "$B" "${DEMO[@]}" --train_type bnb_llama_pro --llama_pro_num_new_blocks 2 --batch_size 1 --gradient_accumulation_steps 8
demo pro_bnb_np2 env FSDPQ_SHARE_GPUS=1 mpirun --allow-run-as-root --oversubscribe -np 2 -x LD_LIBRARY_PATH \
  -x FSDPQ_SHARE_GPUS "$B" "${DEMO[@]}" --train_type bnb_llama_pro --llama_pro_num_new_blocks 2 --batch_size 1 \
  --gradient_accumulation_steps 4
python3 - "$OUT" <<'PY'
import json, sys
def losses(name):
    try:
        return [r["loss"] for r in map(json.loads, open(f"{sys.argv[1]}/{name}.metrics.jsonl")) if r["type"] == "step"]
    except OSError as e:
        print(name, "no metrics:", e); return []
runs = {n: losses(n) for n in ("pro_bnb", "pro_hqq", "base_qlora", "base_hqq", "pro_bnb_offload", "pro_bnb_bs1",
                                "pro_bnb_np2")}
for pro, base in (("pro_bnb", "base_qlora"), ("pro_hqq", "base_hqq")):
    p, b = runs[pro], runs[base]
    if p and b:
        print(f"{pro}: first loss {p[0]!r} vs {base} {b[0]!r}: {'identical' if p[0] == b[0] else 'DIFFER'}; "
              f"mean of first 5 {sum(p[:5]) / 5:.4f} -> last 5 {sum(p[-5:]) / 5:.4f}")
for ref, other in (("pro_bnb", "pro_bnb_offload"), ("pro_bnb_bs1", "pro_bnb_np2")):
    a, o = runs[ref], runs[other]
    if a and o:
        worst = max(abs(x - y) / abs(x) for x, y in zip(a, o))
        print(f"{other} against {ref}: worst relative loss difference {worst:.2e} over {len(o)} steps")
PY

# preset:llama2-7b, bs 4, ctx 512, checkpointing, 10 steps; $1 its name, the rest its flags.
seven() {
  local name=$1; shift
  "$B" plan --model_name preset:llama2-7b --tokenizer_path builtin:bytes --dataset dummy --context_length 512 \
    --batch_size 4 --gpu-mem 141 "$@" > "$OUT/$name.plan.txt" 2>&1
  timeout 200 "$B" --model_name preset:llama2-7b --tokenizer_path builtin:bytes --dataset dummy --dataset_samples 64 \
    --context_length 512 --pad_to_context_length true --batch_size 4 --max_steps 10 --log_to stdout \
    --output_dir "$W/$name" "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$?: $(grep -E '^model ready' "$OUT/$name.log" | cut -c1-100)"
  cp "$W/$name/metrics.jsonl" "$OUT/$name.metrics.jsonl" 2>/dev/null
}
echo "== preset:llama2-7b: qlora r64 next to bnb_llama_pro (8 new blocks: 40 layers), bs 4, ctx 512"
seven q7 --train_type qlora --lora_rank 64 --lora_alpha 16 --lora_dropout 0.1
seven pro7 --train_type bnb_llama_pro --llama_pro_num_new_blocks 8
python3 - "$OUT" <<'PY'
import json, re, sys
out = sys.argv[1]
for name in ("q7", "pro7"):
    try:
        rows = [json.loads(l) for l in open(f"{out}/{name}.metrics.jsonl")]
    except OSError as e:
        print(name, "no metrics:", e); continue
    steps = [r for r in rows if r["type"] == "step"]
    summary = next((r for r in rows if r["type"] == "summary"), {})
    tps = sum(s["tokens"] for s in steps[1:]) / sum(s["step_seconds"] for s in steps[1:])
    plan = open(f"{out}/{name}.plan.txt").read()
    predicted = re.search(r"\*\*peak allocated\*\* \| ([0-9.]+)", plan)
    peak = summary.get("peak_device_allocated_bytes", 0) / 2**30
    losses = " ".join("%.4f" % s["loss"] for s in steps)
    print(f"{name}: {tps:.0f} tok/s (steps 2-{len(steps)}), peak allocated {peak:.2f} GiB "
          f"(plan: {predicted.group(1) if predicted else '?'} GiB), losses {losses}")
PY
