#!/usr/bin/env bash
# One device call comparing builds side by side on one GPU: the newest build's GPU tests, op perf
# lines of every build, the 7B QLoRA step of every build (scripts/device_attention_step.sh), and
# optionally a per-kernel profile of one step (ncu, kernel names and durations, aggregated).
# Prepare here, for a build of this tree and one of a baseline worktree (e.g. /work/wt-base):
#   mkdir -p .device/base/build/tests && cp /work/wt-base/build/fsdpq .device/base/build/ &&
#   cp /work/wt-base/build/tests/fsdpq_gpu_tests .device/base/build/tests/ &&
#   ../shared/device/bundle-libs.sh build/fsdpq build/tests/fsdpq_gpu_tests .device/lib &&
#   scripts/device_pack.sh build/fsdpq build/tests/fsdpq_gpu_tests .device/lib .device/base
# Run there with carry [".device/pack.tar.xz"]:
#   tar xJf .device/pack.tar.xz && bash scripts/device_compare.sh
# Settings: BUILDS="base=.device/base new=." (label=root, or label=root@VAR=value[@VAR2=value2] for
#   that build's step with those set; the last one's GPU tests run), POINTS (checkpointing:batch
#   size pairs of the step, default false:4), FLAGS_<label> (that label's extra fsdpq flags),
#   TESTS='gtest filter' (default every GPU test; none: skip), PERF='gtest filter' (FSDPQ_GPU_PERF=1
#   lines, every build), STEP=1 (the 7B step of every build), HF=1 (HF + PEFT parity of the last
#   build; needs bench/fetch_peer_wheels.sh's .device/wheels packed too), PROFILE=label (ncu of that
#   build's one step on a 2-layer model of the 7B's width, PROFILE_LAYERS to change). BUDGET (s,
#   default 560) bounds the whole call; ROUTES (FSDPQ_ATTENTION of the step, default auto: builds older
#   than the Hopper attention know only mma, simt, cudnn, cudnn-nondeterministic).
export LD_LIBRARY_PATH=$PWD/.device/lib:${LD_LIBRARY_PATH:-}
BUILDS=${BUILDS:-base=.device/base new=.}
last=${BUILDS##* }; last_root=${last#*=}; last_root=${last_root%%@*}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
started=$(date +%s); left() { echo $(( ${BUDGET:-560} - ($(date +%s) - started) )); }

if [ "${TESTS:-*}" != none ]; then
  timeout $(( $(left) / 2 )) $last_root/build/tests/fsdpq_gpu_tests --gtest_filter="${TESTS:-*}" > $OUT/gpu_tests.log 2>&1
  echo "gpu tests (${last%%=*}, ${TESTS:-*}) rc=$? $(date +%T)"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|tests ran" $OUT/gpu_tests.log | head -20
fi

if [ -n "${PERF:-}" ]; then
  done_roots=" "
  for b in $BUILDS; do
    root=${b#*=}; root=${root%%@*}
    [[ $done_roots == *" $root "* ]] && continue  # each binary once (label=root@VAR=... is the same binary)
    done_roots="$done_roots$root "
    FSDPQ_GPU_PERF=1 timeout 120 $root/build/tests/fsdpq_gpu_tests --gtest_filter="$PERF" > $OUT/perf_${b%%=*}.log 2>&1
    echo "perf ${b%%=*} rc=$?"; grep -iE "ms|TFLOP|GB/s" $OUT/perf_${b%%=*}.log | grep -v "^\[" | head -20
  done
fi

# (each part below needs a floor of the budget left; one it cannot start says so, not silently)
skipped() { echo "device_compare: $1 skipped: $(left) s of BUDGET=${BUDGET:-560} left, it needs more than $2" >&2; }
[ "${STEP:-1}" = 1 ] && [ $(left) -le 120 ] && skipped "the step" 120
if [ "${STEP:-1}" = 1 ] && [ $(left) -gt 120 ]; then
  binaries=""
  for b in $BUILDS; do
    root=${b#*=}; env_setting=""
    [[ $root == *@* ]] && env_setting=${root#*@} && root=${root%%@*}  # label=root@VAR=value: that build with VAR set
    exe=$PWD/$root/build/fsdpq
    if [ -n "$env_setting" ]; then
      exe=$(mktemp -d)/fsdpq; printf '#!/bin/sh\nexport %s\nexec %s "$@"\n' "${env_setting//@/ }" "$PWD/$root/build/fsdpq" > $exe
      chmod +x $exe
    fi
    binaries="$binaries ${b%%=*}=$exe"
  done
  BINARIES="$binaries" ROUTES=${ROUTES:-auto} POINTS="${POINTS:-false:4}" STEPS=${STEPS:-6} SKIP=hf bash scripts/device_attention_step.sh  # prints the sections too
fi

[ "${HF:-0}" = 1 ] && [ $(left) -le 150 ] && skipped "HF parity" 150
if [ "${HF:-0}" = 1 ] && [ $(left) -gt 150 ]; then  # HF + PEFT (+ bitsandbytes) parity of the last build
  FSDPQ=$PWD/$last_root/build/fsdpq TESTS=$PWD/$last_root/build/tests/fsdpq_gpu_tests ROUTES_HF=auto SKIP=step \
    bash scripts/device_attention_step.sh
fi

[ -n "${PROFILE:-}" ] && [ $(left) -le 150 ] && skipped "the profile" 150
if [ -n "${PROFILE:-}" ] && [ $(left) -gt 150 ]; then
  # ncu over one step of a 2-layer model of the 7B's width (a whole 7B step is too many kernels for
  # ncu's replay): every kernel's name and duration, for a per-layer breakdown, and how close it runs
  # to a limit (DRAM bytes, speed of light: analysis/ncu_breakdown.py's METRICS_FOR_ROOFLINE).
  METRICS=$(python3 -c "import sys; sys.path.insert(0, 'analysis'); import ncu_breakdown as n; print(','.join(('gpu__time_duration.sum',) + n.METRICS_FOR_ROOFLINE))")
  for b in $BUILDS; do [ "${b%%=*}" = "$PROFILE" ] && exe=$PWD/${b#*=}/build/fsdpq; done
  W=$(mktemp -d)
  $exe init-model --preset llama2-7b --num_hidden_layers ${PROFILE_LAYERS:-2} --out $W/m > $OUT/ncu_init.log 2>&1
  timeout $(( $(left) - 30 )) ncu --clock-control none --metrics "$METRICS" --csv --print-units base \
    $exe --model_name $W/m --tokenizer_path builtin:bytes --train_type qlora --dataset dummy \
    --dataset_samples 8 --context_length 2048 --pad_to_context_length true --batch_size 4 --max_steps 2 \
    --lora_rank 64 --lora_alpha 16 --lora_dropout 0.1 --use_gradient_checkpointing false --output_dir $W/p \
    > $OUT/ncu.csv 2> $OUT/ncu.err
  echo "ncu rc=$? $(wc -l < $OUT/ncu.csv) lines"
  python3 analysis/ncu_breakdown.py $OUT/ncu.csv --layers ${PROFILE_LAYERS:-2}
  xz -T4 $OUT/ncu.csv
fi
echo "done, $(left) s of the budget left"
