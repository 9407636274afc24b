#!/usr/bin/env bash
# Issue #7 on a multi-GPU kind (nvidia-h200-x2 / -x4 / -x8), in as few device calls as the budget
# allows. Every section prints a short table; logs go under $OUT. Prepare here:
#   make build; ../shared/device/bundle-libs.sh build/fsdpq build/tests/fsdpq_unit_tests .device/lib
# Run there with carry [".device/lib", "build/fsdpq", "build/tests/fsdpq_unit_tests"]:
#   bash scripts/device_multi_gpu.sh
#   SKIP=equivalence,scaling,resume   leave sections out
#   MODELS="7b 70b" GPUS="1 2 4 8" STRATEGIES="full_shard shard_grad_op ddp hybrid_full_shard" OFFLOAD="false true"
#   STEPS=6 CTX=2048                  narrow or widen the scaling grid (GPU counts above the machine's are skipped)
# NCCL carries the collectives wherever every rank has its own GPU (fsdp/device_collectives.h);
# FSDPQ_SHARE_GPUS=1 lets the 4-rank tests run on 2 GPUs (staged MPI there). NVLink multicast off.
export LD_LIBRARY_PATH=$PWD/.device/lib:$LD_LIBRARY_PATH OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export NCCL_NVLS_ENABLE=0 FSDPQ_SHARE_GPUS=1
B=$PWD/build/fsdpq; W=$(mktemp -d)
skip() { [[ ",${SKIP:-}," == *",$1,"* ]]; }
NGPU=$(nvidia-smi -L | wc -l); echo "GPUs: $NGPU"; nvidia-smi topo -m 2>/dev/null | head -12

if ! skip equivalence; then
  echo "== NCCL equivalence: world 1/2/4, every strategy (tests/unit/fsdp_train_test.cpp), and checkpoints"
  [ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }  # the test binary's built-in paths
  timeout 420 build/tests/fsdpq_unit_tests --gtest_filter='*Equivalence*:Checkpoints.ResumesAtOtherWorldSizes*' \
    > $OUT/equivalence.log 2>&1
  echo "rc=$?"; grep -E "^\[ +(OK|FAILED) +\]|Failure|max relative difference" $OUT/equivalence.log | head -50
fi

# One training run: model, GPUs, strategy, offload, extra flags; metrics under $W/<name>
# (RUN_NAME, RUN_STEPS and RUN_SAMPLES override the name, step count and sample count).
run() {
  local m=$1 g=$2 s=$3 o=$4; shift 4
  local name=${RUN_NAME:-${m}_g${g}_${s}_off${o}} bs=4; [ "$m" = 70b ] && bs=1
  local extra=(); [[ $s == hybrid* ]] && extra=(--ranks_per_node $(( g > 1 ? g / 2 : 1 )))
  timeout 300 mpirun --allow-run-as-root -np $g -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x FSDPQ_SHARE_GPUS $B \
    --model_name preset:llama2-$m --tokenizer_path builtin:bytes --train_type qlora --dataset dummy \
    --dataset_samples ${RUN_SAMPLES:-$(( 16 * g * bs ))} --context_length ${CTX:-2048} --pad_to_context_length true --batch_size $bs \
    --max_steps ${RUN_STEPS:-${STEPS:-6}} --lora_rank 64 --lora_alpha 16 --lora_dropout 0.1 --sharding_strategy $s \
    --use_cpu_offload $o --log_to stdout --output_dir $W/$name "${extra[@]}" "$@" > $OUT/$name.log 2>&1
  echo "$name rc=$?"; grep -E "collectives over|error" $OUT/$name.log | head -2
}

if ! skip scaling; then
  echo "== scaling: QLoRA r 64, ctx ${CTX:-2048}, bs 4 (7B) / 1 (70B) per GPU, ${STEPS:-6} steps"
  for m in ${MODELS:-7b 70b}; do
    for g in ${GPUS:-1 2 4 8}; do
      [ $g -gt $NGPU ] && continue
      for s in ${STRATEGIES:-full_shard shard_grad_op ddp hybrid_full_shard}; do
        [[ $s == hybrid* ]] && [ $g -lt 2 ] && continue
        for o in ${OFFLOAD:-false true}; do
          [ $s = ddp ] && [ $o = true ] && [ $g -gt 1 ] && continue
          run $m $g $s $o
        done
      done
    done
  done
  python3 - $W <<'PY'
import glob, json, os, sys
rows = {}
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*", "metrics.jsonl"))):
    name = os.path.basename(os.path.dirname(path))
    recs = [json.loads(l) for l in open(path)]
    steps = [r for r in recs if r["type"] == "step"][1:]
    summary = next((r for r in recs if r["type"] == "summary"), {})
    if not steps:
        continue
    sec = sum(s["step_seconds"] for s in steps)
    ph = {k: sum(s["phase_seconds"].get(k, 0) for s in steps) / len(steps) for k in steps[0]["phase_seconds"]}
    rows[name] = (sum(s["tokens"] for s in steps) / sec, sec / len(steps), ph, summary.get("peak_device_allocated_bytes", 0))
print(f"{'run':36} {'tok/s':>8} {'s/step':>7} {'gather wait':>11} {'reduce':>7} {'peak GiB':>8} {'scaling':>8}")
for name, (tps, step, ph, peak) in rows.items():
    m, g, s, o = name.split("_", 3)[0], int(name.split("_")[1][1:]), "_".join(name.split("_")[2:-1]), name.split("_")[-1]
    one = rows.get(f"{m}_g1_full_shard_{o}") or rows.get(f"{m}_g1_full_shard_offfalse")
    eff = f"{100 * tps / (g * one[0]):.0f}%" if one else "-"
    print(f"{name:36} {tps:8.0f} {step:7.3f} {ph.get('gather_wait', 0):11.3f} {ph.get('reduce', 0):7.3f} {peak / 2**30:8.2f} {eff:>8}")
print("scaling = tokens/s / (GPUs × the 1-GPU run's); gather wait and reduce = the collectives' time not hidden behind compute (s/step)")
PY
fi

if ! skip resume; then
  echo "== checkpoint written at 4 GPUs, resumed at 2 and at 8 (same global batch 32), against an uninterrupted 4-GPU run"
  if [ $NGPU -ge 4 ]; then
    export RUN_SAMPLES=256  # one dataset for all three runs: 8 steps x global batch 32
    RUN_NAME=ref_g4 RUN_STEPS=8 run 7b 4 full_shard false --gradient_accumulation_steps 2
    for g in 2 8; do
      [ $g -gt $NGPU ] && continue
      ck=$W/ck_4to$g
      RUN_NAME=first_4to$g RUN_STEPS=4 run 7b 4 full_shard false --save_every_steps 4 \
        --gradient_accumulation_steps 2 --checkpoint_dir $ck
      RUN_NAME=resumed_4to$g RUN_STEPS=8 run 7b $g full_shard false --save_every_steps 4 \
        --gradient_accumulation_steps $(( 8 / g )) --checkpoint_dir $ck --resume auto
      python3 - $W $g <<'PY'
import json, os, sys
w, g = sys.argv[1], sys.argv[2]
def losses(name):
    try:
        return [r["loss"] for r in map(json.loads, open(os.path.join(w, name, "metrics.jsonl"))) if r["type"] == "step"]
    except OSError:
        return []
ref, res = losses("ref_g4")[4:], losses(f"resumed_4to{g}")[-4:]
worst = max((abs(a - b) / abs(a) for a, b in zip(ref, res)), default=float("nan"))
print(f"4 -> {g} GPUs: steps 5-8 reference {ref}, resumed {res}, worst relative difference {worst:.2e}")
PY
    done
    unset RUN_SAMPLES
  else
    echo "needs 4 GPUs"
  fi
fi
