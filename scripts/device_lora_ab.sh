#!/usr/bin/env bash
# A/B of two fsdpq binaries on the GPU, same run, same machine: Llama-2-7B-shape QLoRA r64 a16,
# fixed-length dummy records, tokens/s over the steps after the first two and the peak allocated.
# Prepare here: build both binaries (e.g. the parent commit in a git worktree), bundle the libraries
# into .device/lib (../shared/device/README.md). Run there with carry [".device/lib", A, B]:
#   A=old/fsdpq B=build/fsdpq bash scripts/device_lora_ab.sh
# env: POINTS ("ctx:bs:dropout ..."), STEPS (default 7), EXTRA (flags for every run, e.g.
# "--use_cpu_offload true"), ENV_A / ENV_B (environment for one side's runs, e.g.
# ENV_B="OMP_NUM_THREADS=15"), REPS (A B A B ... rounds per point, default 1: more rounds show the
# run-to-run noise), TAG (names the runs), SECTIONS=1 adds B's FSDPQ_SECTION_TIMES run of the first point.
export LD_LIBRARY_PATH=$PWD/.device/lib:$LD_LIBRARY_PATH
A=${A:?the baseline binary}; B=${B:?the candidate binary}; W=$(mktemp -d)
POINTS=${POINTS:-"512:4:0.1 2048:8:0.1 512:4:0 2048:8:0"}; STEPS=${STEPS:-7}
run() {  # name binary ctx bs dropout [env...]
  local name=$1 bin=$2 ctx=$3 bs=$4 drop=$5; shift 5
  env "$@" timeout 300 "$bin" --model_name preset:llama2-7b --tokenizer_path builtin:bytes --train_type qlora \
    --dataset dummy --dataset_samples $((bs * STEPS)) --context_length "$ctx" --pad_to_context_length true \
    --batch_size "$bs" --max_steps "$STEPS" --lora_rank 64 --lora_alpha 16 --lora_dropout "$drop" --lr 1e-5 \
    ${EXTRA:-} --log_to stdout --output_dir "$W/$name" > "$W/$name.log" 2>&1 || { echo "$name rc=$?"; tail -5 "$W/$name.log"; }
  python3 - "$W/$name" "$name" "$STEPS" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl") if l.strip()]
steps = [r for r in rows if r.get("type") == "step" and r["step"] > 2]
s = next((r for r in rows if r.get("type") == "summary"), {})
tps = sum(r["tokens"] for r in steps) / sum(r["step_seconds"] for r in steps)
loss = " ".join(f"{r['loss']:.4f}" for r in rows if r.get("type") == "step")
last = next(r for r in reversed(rows) if r.get("type") == "step")
host = last.get("phase_seconds", {}).get("host_optimizer_overlapped")
print(f"{sys.argv[2]:34s} {tps:9,.0f} tok/s  peak {s.get('peak_device_allocated_bytes', 0) / 2**30:6.2f} GiB"
      + (f"  host worker {host:.3f} s/step" if host else "") + f"  losses {loss}")
sec = s.get("section_seconds")
if sec:
    for k, v in sorted(sec.items(), key=lambda kv: -kv[1]):
        print(f"    {k:28s} {v * 1000 / (int(sys.argv[3]) - 1):8.1f} ms/step")  # totals over the steps after the first
PY
}
for p in $POINTS; do
  IFS=: read -r ctx bs drop <<< "$p"
  for rep in $(seq "${REPS:-1}"); do
    for side in A B; do
      envvar=ENV_$side
      run "${side}${TAG:-}_c${ctx}_b${bs}_d${drop}_r$rep" "${!side}" "$ctx" "$bs" "$drop" ${!envvar:-}
    done
  done
done
if [ "${SECTIONS:-0}" = 1 ]; then
  IFS=: read -r ctx bs drop <<< "${POINTS%% *}"
  run "B_sections_c${ctx}_b${bs}_d${drop}" "$B" "$ctx" "$bs" "$drop" FSDPQ_SECTION_TIMES=1
fi
