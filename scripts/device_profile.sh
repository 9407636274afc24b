#!/usr/bin/env bash
# One device call: where a Llama-2-7B-shape QLoRA step spends its GPU time, kernel by kernel
# (Nsight Systems' CUDA kernel summary), to choose the next speed work. Prepare here:
#   make build; ../shared/device/bundle-libs.sh build/fsdpq .device/lib
# Run there with carry [".device/lib", "build/fsdpq"]:
#   bash scripts/device_profile.sh            (CTX=2048 BS=8 STEPS=3 by default; EXTRA="--flag value ..." adds
#                                              fsdpq flags, e.g. EXTRA="--use_gradient_checkpointing false")
export LD_LIBRARY_PATH=$PWD/.device/lib:$LD_LIBRARY_PATH
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
if [ -z "$NSYS" ]; then echo "no nsys on this machine"; exit 0; fi
W=$(mktemp -d)
timeout 240 "$NSYS" profile -o $W/fsdpq --force-overwrite true --trace cuda --sample none --cpuctxsw none \
  build/fsdpq --model_name preset:llama2-7b --tokenizer_path builtin:bytes --train_type qlora --dataset dummy \
  --dataset_samples 64 --context_length ${CTX:-2048} --pad_to_context_length true --batch_size ${BS:-8} \
  --max_steps ${STEPS:-3} --lora_rank 64 --lora_alpha 16 --lora_dropout 0.1 --log_to stdout --output_dir $W/out ${EXTRA:-} \
  > $W/run.log 2>&1
echo "profile rc=$?"; grep -E "step|error" $W/run.log | tail -4
"$NSYS" stats --report cuda_gpu_kern_sum --format csv --output - $W/fsdpq.nsys-rep 2>/dev/null > $W/kern.csv
python3 - $W/kern.csv <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 8]
head, body = rows[0], rows[1:]
t = head.index("Total Time (ns)"); n = head.index("Instances"); name = head.index("Name")
total = sum(float(r[t]) for r in body if r[t].replace('.', '', 1).isdigit())
print(f"GPU kernel time {total / 1e9:.3f} s over the run; top kernels:")
for r in body[:30]:
    print(f"{100 * float(r[t]) / total:5.1f}%  {float(r[t]) / 1e6:9.1f} ms  {r[n]:>7}x  {r[name][:110]}")
PY
