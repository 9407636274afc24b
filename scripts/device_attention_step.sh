#!/usr/bin/env bash
# One device call for issue #22's whole-model proof: the Llama-2-7B-shape QLoRA step at ctx 2048 on
# each attention route (FSDPQ_ATTENTION), with and without gradient checkpointing, with
# FSDPQ_SECTION_TIMES=1, then HF + PEFT (+ bitsandbytes) parity on the cuDNN routes. Prepare here:
#   cmake --build build -j2 && ../shared/device/bundle-libs.sh build/fsdpq build/tests/fsdpq_gpu_tests .device/lib
#   bench/fetch_peer_wheels.sh
# Run there with carry [".device", "build/fsdpq", "build/tests/fsdpq_gpu_tests"]:
#   bash scripts/device_attention_step.sh   (ROUTES="mma cudnn cudnn-nondeterministic", POINTS="false:4 true:8"
#                                            = checkpointing:batch size, STEPS=5, SKIP=step,hf narrow it;
#                                            BINARIES="before=path/fsdpq after=other/fsdpq" compares builds
#                                            (FLAGS_after="--key value" gives one of them extra flags)
#                                            in the same run; FSDPQ=, TESTS=path/fsdpq_gpu_tests for the HF parity)
B=${FSDPQ:-$PWD/build/fsdpq}; T=${TESTS:-$PWD/build/tests/fsdpq_gpu_tests}; W=$(mktemp -d)
skip() { [[ ",${SKIP:-}," == *",$1,"* ]]; }
CUDNN_LIB=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))' 2>/dev/null)
for p in $(python3 -c 'import nvidia.cudnn, os; print(" ".join(os.path.join(p, "lib") for p in nvidia.cudnn.__path__))' 2>/dev/null); do
  ls $p/libcudnn.so.9* > /dev/null 2>&1 && CUDNN_LIB=$p
done
export LD_LIBRARY_PATH=$PWD/.device/lib:${LD_LIBRARY_PATH:-}:$CUDNN_LIB
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "cuDNN from $CUDNN_LIB"

if ! skip step; then
  for point in ${POINTS:-false:4 true:8}; do
    ckpt=${point%:*}; bs=${point#*:}
    for route in ${ROUTES:-mma cudnn cudnn-nondeterministic}; do
    for binary in ${BINARIES:-fsdpq=$B}; do
      label=${binary%%=*}; exe=${binary#*=}; flags_of=FLAGS_$label  # FLAGS_<label>: that binary's extra flags
      name=${route}__${label}_ckpt${ckpt}_bs$bs  # __, not @: the device tool returns plain names only
      FSDPQ_ATTENTION=$route FSDPQ_SECTION_TIMES=1 timeout 150 $exe --model_name preset:llama2-7b --tokenizer_path builtin:bytes \
        --train_type qlora --dataset dummy --dataset_samples 80 --context_length 2048 --pad_to_context_length true \
        --batch_size $bs --max_steps ${STEPS:-5} --lora_rank 64 --lora_alpha 16 --lora_dropout 0.1 \
        --use_gradient_checkpointing $ckpt --log_to stdout --output_dir $W/$name ${!flags_of:-} > $OUT/$name.log 2>&1
      echo "$name rc=$? $(date +%T)"; grep -E "error|warning: attention" $OUT/$name.log | sort | uniq | head -3
      cp $W/$name/metrics.jsonl $OUT/$name.metrics.jsonl 2>/dev/null
    done
    done
  done
  python3 - $OUT <<'PY'
import glob, json, os, sys
print("\n| route @ binary | checkpointing | bs | tokens/s (steps 2..) | peak allocated GiB | attention fwd ms/step | attention bwd ms/step | losses | step s | cudaMallocs after each step |")
print("|---|---|---|---|---|---|---|---|---|---|")
for path in sorted(glob.glob(f"{sys.argv[1]}/*.metrics.jsonl")):
    rows = [json.loads(l) for l in open(path)]
    steps = [r for r in rows if r.get("type") == "step"]
    summary = next((r for r in rows if r.get("type") == "summary"), {})
    if len(steps) < 2:
        print(f"| {os.path.basename(path)} | too few steps |"); continue
    tps = sum(s["tokens"] for s in steps[1:]) / sum(s["step_seconds"] for s in steps[1:])
    sec = summary.get("section_seconds", {})
    def ms(key):
        for k, v in (sec.items() if isinstance(sec, dict) else []):
            if k == key:
                return f"{1e3 * (v['seconds'] if isinstance(v, dict) else v) / max(1, len(steps) - 1):.1f}"
        return "?"
    losses = " ".join("%.4f" % s["loss"] for s in steps)
    times = " ".join("%.3f" % s["step_seconds"] for s in steps)
    # With --profile_memory: the caching allocator's misses so far, after each optimizer step.
    mallocs = " ".join(str(r.get("device_allocations", "?")) for r in rows
                       if r.get("type") == "memory" and r.get("at") == "after_optimizer") or "-"
    route, rest = os.path.basename(path).split("_ckpt")
    route = route.replace("__", " @ ")
    ckpt, bs = rest.split(".")[0].split("_bs")
    print(f"| {route} | {ckpt} | {bs} | {tps:,.0f} | {summary.get('peak_device_allocated_bytes', 0) / 2**30:.2f} | "
          f"{ms('attention')} | {ms('attention bwd')} | {losses} | {times} | {mallocs} |")
PY
  for f in $OUT/*_ckptfalse_*.log; do echo "-- $(basename $f)"; grep -E "section " $f | head -12; done
fi

if ! skip hf; then
  python3 -m pip install -q --no-deps --target /tmp/bnb-site .device/wheels/bitsandbytes-*.whl > /dev/null 2>&1
  for route in ${ROUTES_HF:-cudnn cudnn-nondeterministic}; do
    FSDPQ_ATTENTION=$route PYTHONPATH=/tmp/bnb-site timeout 150 python3 tests/reference/hf_train_parity.py --fsdpq $B \
      --gpu-tests "$T" --dir $W/hf_$route --precision bf16 > $OUT/hf_parity_$route.log 2>&1
    echo "HF parity bf16, FSDPQ_ATTENTION=$route rc=$?"; grep -E "loss hf|MISMATCH|Error|ok" $OUT/hf_parity_$route.log | head -8
  done
fi
