#!/usr/bin/env python3
"""fsdpq's GPU training pass against Hugging Face transformers + PEFT (+ bitsandbytes for QLoRA).

    python3 tests/reference/hf_train_parity.py --fsdpq build/fsdpq --gpu-tests build/tests/fsdpq_gpu_tests \
        --dir WORK [--precision bf16|fp32] [--dora]

1. Writes a tiny random model with `fsdpq init-model --preset tiny`, a PEFT LoRA adapter with random A
   and B (r 8, alpha 16, fsdp_qlora's targets q,k,v,gate,up,down) and a batch of random tokens.
2. Runs fsdpq's half (tests/gpu/hf_parity_dump_gpu_test.cpp) for train_type lora and qlora on the GPU:
   loss, logits and LoRA gradients of one pass, dropout 0.
3. Computes the same with LlamaForCausalLM + PeftModel: lora on the dense base in the run's dtype,
   qlora with bitsandbytes Linear4bit (NF4, blocksize 64, double quant, compute dtype = the run's,
   quant storage bf16: fsdp_qlora's setup, whose bytes equal fsdpq's, docs/nf4.md), and compares:
   loss relative, logits and every gradient by normalized L2 error, against the tolerances below.
With --dora the adapter is PEFT's DoRA (use_dora=True; its magnitude vectors random around the
base's row norms) and the train types are DoRA over the dense base ("dora") and over NF4
(bnb_dora); the magnitudes' gradients are compared with lora_A's and lora_B's.
Needs torch, transformers, peft and (for qlora / bnb_dora) bitsandbytes. Exits 1 on any mismatch.
"""
import argparse
import json
import os
import subprocess
import sys

import torch

TOL = {  # loss (relative), logits and gradients (normalized L2)
    "fp32": {"loss": 1e-5, "logits": 1e-4, "grads": 1e-3},
    # bf16: both sides round activations to bf16 at every op boundary, in different places (HF
    # rounds LoRA's scaling product and silu(gate); fsdpq rounds once per op), so a few bf16 ulps.
    "bf16": {"loss": 5e-3, "logits": 3e-2, "grads": 8e-2},
}
TARGETS = ["q_proj", "k_proj", "v_proj", "up_proj", "down_proj", "gate_proj"]


def normalized(a, b):
    a, b = torch.as_tensor(a, dtype=torch.float64).flatten(), torch.as_tensor(b, dtype=torch.float64).flatten()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsdpq", required=True)
    ap.add_argument("--gpu-tests", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--dora", action="store_true", help="a DoRA adapter (use_dora=True) and the DoRA train types")
    a = ap.parse_args()
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import BitsAndBytesConfig, LlamaForCausalLM

    os.makedirs(a.dir, exist_ok=True)
    model_dir, adapter_dir = os.path.join(a.dir, "model"), os.path.join(a.dir, "adapter")
    subprocess.run([a.fsdpq, "init-model", "--preset", "tiny", "--out", model_dir, "--seed", "3", "--overwrite"],
                   check=True, stdout=subprocess.DEVNULL)
    torch.manual_seed(0)
    base = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    peft_model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=TARGETS,
                                                 use_dora=a.dora))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_magnitude_vector" in name:
                p.mul_(1.0 + 0.1 * torch.randn_like(p))  # around the row norms PEFT initialised it to
            elif "lora_" in name:
                p.normal_(0.0, 0.05)
    peft_model.save_pretrained(adapter_dir)
    vocab = base.config.vocab_size
    ids = torch.randint(0, vocab, (2, 33), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    labels[:, :2] = -100
    with open(os.path.join(a.dir, "batch.json"), "w") as f:
        json.dump({"input_ids": ids.tolist(), "labels": labels.tolist(), "precision": a.precision}, f)

    env = dict(os.environ, FSDPQ_HF_PARITY_DIR=a.dir)
    subprocess.run([a.gpu_tests, "--gtest_filter=GpuHfParity.*"], check=True, env=env)

    dtype = torch.bfloat16 if a.precision == "bf16" else torch.float32
    tol, problems = TOL[a.precision], []
    for train_type in ("dora", "bnb_dora") if a.dora else ("lora", "qlora"):
        ours = json.load(open(os.path.join(a.dir, f"fsdpq_{train_type}.json")))
        kwargs = {"torch_dtype": dtype}
        if train_type in ("qlora", "bnb_dora"):
            kwargs["quantization_config"] = BitsAndBytesConfig(
                load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                bnb_4bit_compute_dtype=dtype, bnb_4bit_quant_storage=torch.bfloat16)
        hf = LlamaForCausalLM.from_pretrained(model_dir, device_map={"": 0}, **kwargs)
        hf = PeftModel.from_pretrained(hf, adapter_dir, is_trainable=True, autocast_adapter_dtype=False)
        for name, p in hf.named_parameters():
            if "lora_" in name:
                p.data = p.data.to(dtype)  # fsdpq computes the adapters in the run's dtype
        out = hf(input_ids=ids.cuda(), labels=labels.cuda())
        out.loss.backward()
        rel = abs(out.loss.item() - ours["loss"]) / abs(out.loss.item())
        logits_err = normalized(ours["logits"], out.logits.float().cpu())
        worst, worst_name = 0.0, ""
        for name, p in hf.named_parameters():
            if "lora_" not in name:
                continue
            key = name.replace(".default", "")
            if key.endswith(".lora_magnitude_vector.weight"):  # PEFT saves the magnitude without ".weight"
                key = key[: -len(".weight")]
            if key not in ours["grads"]:
                problems.append(f"{train_type}: fsdpq has no gradient for {key}")
                continue
            err = normalized(ours["grads"][key], p.grad.float().cpu())
            if err > worst:
                worst, worst_name = err, key
        print(f"{train_type} {a.precision}: loss hf {out.loss.item():.6f} fsdpq {ours['loss']:.6f} (rel {rel:.1e}); "
              f"logits {logits_err:.1e}; worst gradient {worst:.1e} ({worst_name})")
        for what, value in (("loss", rel), ("logits", logits_err), ("grads", worst)):
            if not value <= tol[what]:
                problems.append(f"{train_type}: {what} error {value:.2e} above {tol[what]:.0e}")
    for p in problems:
        print("MISMATCH", p)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
