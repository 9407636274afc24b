#!/usr/bin/env bash
# One device call for issue #25's table: tokens/s, peak memory and the planner's prediction of the
# train types side by side on preset:llama2-7b (random weights, dummy data, every slot a token):
# qlora r 64, bnb_dora r 64, bnb_llama_pro with 8 new blocks and hqq_lora r 64 (its base quantised at
# start-up by HQQ's solver on the GPU; the run's log says how long it took). Prepare here:
#   make build && ../shared/device/bundle-libs.sh build/fsdpq .device/lib
# Run there with carry [".device/lib", "build/fsdpq"] (or scripts/device_pack.sh):
#   bash scripts/device_train_types.sh   (TYPES="qlora bnb_dora bnb_llama_pro hqq_lora", MODEL, NEW_BLOCKS=8, CTX=512,
#                                         BS=4, CKPT=true, STEPS=10, FSDPQ= another binary)
B=${FSDPQ:-$PWD/build/fsdpq}; W=$(mktemp -d); OUT=${OUT:-$W}
export LD_LIBRARY_PATH=$PWD/.device/lib:${LD_LIBRARY_PATH:-}
MODEL=${MODEL:-preset:llama2-7b}; CTX=${CTX:-512}; BS=${BS:-4}; CKPT=${CKPT:-true}
flags_of() {
  case $1 in
    qlora) echo "--train_type qlora --lora_rank 64 --lora_alpha 16 --lora_dropout 0.1" ;;
    hqq_lora) echo "--train_type hqq_lora --n_bits 4 --lora_rank 64 --lora_alpha 16 --lora_dropout 0.1" ;;
    bnb_dora) echo "--train_type bnb_dora --lora_rank 64 --lora_alpha 16 --lora_dropout 0.1" ;;
    hqq_dora) echo "--train_type hqq_dora --n_bits 4 --lora_rank 64 --lora_alpha 16 --lora_dropout 0.1" ;;
    bnb_llama_pro) echo "--train_type bnb_llama_pro --llama_pro_num_new_blocks ${NEW_BLOCKS:-8}" ;;
    *) echo "unknown train type $1" >&2; return 1 ;;
  esac
}
echo "== $MODEL, ctx $CTX, bs $BS, checkpointing $CKPT"
for type in ${TYPES:-qlora bnb_dora bnb_llama_pro hqq_lora}; do
  flags=$(flags_of "$type") || continue
  common=(--model_name "$MODEL" --tokenizer_path builtin:bytes --dataset dummy --context_length "$CTX"
          --batch_size "$BS" --use_gradient_checkpointing "$CKPT")
  "$B" plan "${common[@]}" --gpu-mem 141 $flags > "$OUT/$type.plan.txt" 2>&1
  timeout 540 "$B" "${common[@]}" --dataset_samples $((BS * (${STEPS:-10} + 2))) --pad_to_context_length true \
    --max_steps "${STEPS:-10}" --log_to stdout --output_dir "$W/$type" $flags > "$OUT/$type.log" 2>&1
  echo "$type rc=$? $(date +%T): $(grep -E '^model ready' "$OUT/$type.log" | cut -c1-90)"
  grep -E '^hqq: the solver' "$OUT/$type.log"
  cp "$W/$type/metrics.jsonl" "$OUT/$type.metrics.jsonl" 2>/dev/null
done
python3 - "$OUT" ${TYPES:-qlora bnb_dora bnb_llama_pro hqq_lora} <<'PY'
import json, re, sys
out, types = sys.argv[1], sys.argv[2:]
print("\n| train type | tokens/s (steps 2..) | peak allocated GiB | plan GiB | losses |")
print("|---|---|---|---|---|")
for t in types:
    try:
        rows = [json.loads(l) for l in open(f"{out}/{t}.metrics.jsonl")]
    except OSError as e:
        print(f"| {t} | no metrics: {e} |"); continue
    steps = [r for r in rows if r.get("type") == "step"]
    summary = next((r for r in rows if r.get("type") == "summary"), {})
    if len(steps) < 2:
        print(f"| {t} | too few steps |"); continue
    tps = sum(s["tokens"] for s in steps[1:]) / sum(s["step_seconds"] for s in steps[1:])
    plan = re.search(r"\*\*peak allocated\*\* \| ([0-9.]+)", open(f"{out}/{t}.plan.txt").read())
    print(f"| {t} | {tps:,.0f} | {summary.get('peak_device_allocated_bytes', 0) / 2**30:.2f} | "
          f"{plan.group(1) if plan else '?'} | {' '.join('%.3f' % s['loss'] for s in steps)} |")
PY
