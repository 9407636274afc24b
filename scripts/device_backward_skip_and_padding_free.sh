#!/usr/bin/env bash
# One short device call for two speed changes measured against a binary without them (BASE): the
# backward's skip of the frozen layers under Llama-Pro's first new block (bnb_llama_pro, 3 new
# blocks on the 7B shape: the first 10 of 35 layers; docs/llama_pro.md), and padding_free on
# inputs/sql.ini's job (unpacked batch 8, context 512, checkpointing; docs/packing.md). Each pair
# runs twice, alternating; tokens/s and real tokens/s are averaged over steps 3 on. ~3 minutes.
# Prepare here (BASE: a build of a commit before the change, e.g. in a git worktree):
#   mkdir -p .device/data .device/base && cp ../shared/data/sql.jsonl ../shared/data/tokenizer.model .device/data/
#   cp <worktree>/build/fsdpq .device/base/fsdpq
#   ../shared/device/bundle-libs.sh build/fsdpq .device/lib
#   bash scripts/device_pack.sh .device/lib build/fsdpq .device/base .device/data
# Run there with carry [".device/pack.tar.xz"]:
#   tar xJf .device/pack.tar.xz && bash scripts/device_backward_skip_and_padding_free.sh
export LD_LIBRARY_PATH=$PWD/.device/lib:${LD_LIBRARY_PATH:-}
NEW=${FSDPQ:-$PWD/build/fsdpq}; BASE=${BASE:-$PWD/.device/base/fsdpq}; W=$(mktemp -d)
nvidia-smi --query-gpu=name --format=csv,noheader; date +%T

# The mean tokens/s and real tokens/s of a run's steps after the first two.
rates() {
  python3 - "$1" <<'PY'
import json, sys
steps = [r for r in map(json.loads, open(sys.argv[1])) if r.get("type") == "step"][2:]
secs = sum(s["step_seconds"] for s in steps)
print(f"{len(steps)} steps: {sum(s['tokens'] for s in steps) / secs:,.0f} tokens/s, "
      f"{sum(s.get('real_tokens', 0) for s in steps) / secs:,.0f} real tokens/s, "
      f"losses {[round(s['loss'], 4) for s in steps][:4]}")
PY
}
run() {  # run NAME BINARY FLAGS...
  local name=$1 binary=$2; shift 2
  timeout 120 "$binary" "$@" --log_to stdout --output_dir "$W/$name" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(rates "$W/$name/metrics.jsonl" 2>&1 | tail -1)"
}

PRO=(inputs/dummy_7b.ini --train_type bnb_llama_pro --llama_pro_num_new_blocks 3 --context_length 512
     --batch_size 4 --max_steps 8)
SQL=(inputs/sql.ini --model_name preset:llama2-7b --tokenizer_path .device/data/tokenizer.model
     --data_path .device/data/sql.jsonl --max_steps 14 --save_model false --save_every_steps 0)
for i in 1 2; do
  run "pro_base$i" "$BASE" "${PRO[@]}"
  run "pro_new$i" "$NEW" "${PRO[@]}"
  run "sql_padded$i" "$NEW" "${SQL[@]}" --padding_free false
  run "sql_free$i" "$NEW" "${SQL[@]}" --padding_free true
done
date +%T
