#!/usr/bin/env python3
"""Checks fsdpq's LoRA (and DoRA) adapters and merged models against Hugging Face transformers + PEFT.

    python3 tests/reference/peft_load_check.py --base MODEL_DIR --adapter ADAPTER_DIR \
        [--logits LOGITS.json [--atol A] [--rtol R]] [--merged MERGED_DIR] [--dtype float32|bfloat16]

1. Loads MODEL_DIR with AutoModelForCausalLM and ADAPTER_DIR with peft.PeftModel.from_pretrained,
   with PEFT's load warnings about unknown config keys or missing / unexpected adapter keys
   counted as mismatches. Checks that the config reads back as a LoRA config with the file's
   r, lora_alpha and target modules, that every LoRA layer's scaling is lora_alpha / r, and that
   every lora_A / lora_B weight of the model equals the tensor in adapter_model.safetensors
   bit for bit (and that the file has no tensor the model did not take).
2. With --logits (written by `fsdpq generate ... --logits_out FILE`): runs the PEFT model on the
   file's input_ids and compares the last position's logits with fsdpq's:
   |peft - fsdpq| <= atol + rtol * |peft| for every vocabulary entry, and the same argmax.
   Use `--train_type lora --precision fp32` in fsdpq and --dtype float32 here for a tight check
   (the defaults atol 2e-3, rtol 1e-3 are for that); an NF4 / bf16 run needs looser tolerances.
3. With --merged (written by `fsdpq merge`): merges with PEFT's merge_and_unload (base weights in
   --dtype, float32 by default: W + (alpha/r)·B·A in fp32, as fsdpq does), rounds to bf16 and
   compares with every tensor of MERGED_DIR: tensors without an adapter must be equal bit for bit,
   merged ones may differ by at most one bf16 step in at most 0.1% of their values (the order of
   the fp32 sums is not specified).

Needs torch, transformers, peft and safetensors. Prints a report; exits 1 on
any mismatch, 0 when everything agrees.
"""
import argparse
import json
import os
import sys
import warnings

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

import peft
from peft import PeftConfig, PeftModel

failures = []


def fail(message):
    failures.append(message)
    print("MISMATCH: " + message)


def saved_name_to_parameter(name):
    """PEFT's saved name (no adapter name) -> the parameter name inside a PeftModel ('default').
    A DoRA magnitude is saved as '….lora_magnitude_vector' and lives in '….lora_magnitude_vector.default.weight'."""
    if name.endswith(".lora_magnitude_vector"):
        return name + ".default.weight"
    name = name.replace(".lora_A.default.weight", ".lora_A.weight").replace(".lora_B.default.weight", ".lora_B.weight")
    return name.replace(".lora_A.weight", ".lora_A.default.weight").replace(".lora_B.weight", ".lora_B.default.weight")


def check_adapter(model, adapter_dir, config):
    file_tensors = load_file(os.path.join(adapter_dir, "adapter_model.safetensors"))
    params = {n: p for n, p in model.named_parameters() if ".lora_" in n}
    taken = set()
    for name, tensor in file_tensors.items():
        pname = saved_name_to_parameter(name)
        if pname not in params:
            fail(f"adapter tensor {name} has no parameter {pname} in the PEFT model")
            continue
        taken.add(pname)
        param = params[pname].detach().cpu()
        if tuple(param.shape) != tuple(tensor.shape):
            fail(f"{name}: shape {tuple(tensor.shape)} in the file, {tuple(param.shape)} in the model")
            continue
        # An fp32 parameter holds the file's values exactly; a narrower one holds them rounded.
        if param.dtype == torch.float32 or param.dtype == tensor.dtype:
            same = torch.equal(param.float(), tensor.float())
        else:
            same = torch.equal(param, tensor.to(param.dtype))
        if not same:
            diff = (param.float() - tensor.float()).abs().max().item()
            fail(f"{name}: the PEFT model's weight differs from the file (max |diff| {diff:g})")
    for pname in sorted(set(params) - taken):
        fail(f"PEFT parameter {pname} was not in adapter_model.safetensors (left at its initial value)")
    expected_scaling = config.lora_alpha / config.r
    layers = 0
    for module_name, module in model.named_modules():
        if isinstance(module, peft.tuners.lora.LoraLayer) and "default" in getattr(module, "scaling", {}):
            layers += 1
            if abs(module.scaling["default"] - expected_scaling) > 1e-12:
                fail(f"{module_name}: scaling {module.scaling['default']} != lora_alpha / r = {expected_scaling}")
    print(f"adapter: {len(file_tensors)} tensors equal to the file, {layers} LoRA layers with scaling {expected_scaling:g}")


def check_logits(model, logits_file, atol, rtol):
    with open(logits_file) as f:
        ref = json.load(f)
    ids = torch.tensor([ref["input_ids"]], dtype=torch.long)
    with torch.no_grad():
        out = model(input_ids=ids).logits[0, -1].float().cpu()
    fsdpq = torch.tensor(ref["last_logits"], dtype=torch.float32)
    if out.shape != fsdpq.shape:
        fail(f"logits: PEFT gives {tuple(out.shape)} values, fsdpq {tuple(fsdpq.shape)}")
        return
    diff = (out - fsdpq).abs()
    bound = atol + rtol * out.abs()
    bad = int((diff > bound).sum().item())
    print(f"logits ({ref.get('train_type')}, {ref.get('precision')}, {len(ref['input_ids'])} input ids): "
          f"max |diff| {diff.max().item():.3g}, {bad} of {out.numel()} outside atol {atol:g} + rtol {rtol:g}; "
          f"argmax PEFT {int(out.argmax())}, fsdpq {int(fsdpq.argmax())}")
    if bad:
        fail(f"logits: {bad} values differ by more than atol + rtol·|x|")
    if int(out.argmax()) != int(fsdpq.argmax()):
        fail("logits: PEFT and fsdpq choose different greedy tokens")


def merged_tensors(merged_dir):
    single = os.path.join(merged_dir, "model.safetensors")
    if os.path.exists(single):
        files = [single]
    else:
        with open(os.path.join(merged_dir, "model.safetensors.index.json")) as f:
            files = [os.path.join(merged_dir, n) for n in sorted(set(json.load(f)["weight_map"].values()))]
    for path in files:
        with safe_open(path, framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def bf16_steps(a, b):
    """Distance in representable bf16 values between two bf16 tensors of the same sign pattern."""
    ia = a.view(torch.int16).to(torch.int32)
    ib = b.view(torch.int16).to(torch.int32)
    # Map sign-magnitude to a monotonic integer line.
    ia = torch.where(ia < 0, -(ia & 0x7FFF), ia)
    ib = torch.where(ib < 0, -(ib & 0x7FFF), ib)
    return (ia - ib).abs()


def check_merged(model, merged_dir, adapted_bases):
    reference = model.merge_and_unload().state_dict()
    compared = 0
    for name, tensor in merged_tensors(merged_dir):
        compared += 1
        if name not in reference:
            fail(f"merged: {name} is not a tensor of the merged PEFT model")
            continue
        if tensor.dtype != torch.bfloat16:
            fail(f"merged: {name} is {tensor.dtype}, expected torch.bfloat16")
            continue
        want = reference[name].detach().cpu().to(torch.bfloat16)
        if want.shape != tensor.shape:
            fail(f"merged: {name} has shape {tuple(tensor.shape)}, PEFT {tuple(want.shape)}")
            continue
        steps = bf16_steps(tensor, want)
        if name in adapted_bases:
            off = int((steps > 0).sum().item())
            if steps.max().item() > 1 or off > max(1, tensor.numel() // 1000):
                fail(f"merged: {name}: {off} of {tensor.numel()} values differ from PEFT's merge "
                     f"(at most {steps.max().item()} bf16 steps)")
        elif steps.max().item() != 0:
            fail(f"merged: {name} has no adapter but differs from the base")
    written = {name for name, _ in merged_tensors(merged_dir)}
    tied = getattr(model.config, "tie_word_embeddings", False)
    missing = [n for n in reference if n.endswith(".weight") and n not in written and not (n == "lm_head.weight" and tied)]
    for name in missing:
        fail(f"merged: {name} is missing from {merged_dir}")
    print(f"merged: {compared} tensors compared with PEFT's merge_and_unload ({len(adapted_bases)} merged linears)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the base model directory (HF layout)")
    parser.add_argument("--adapter", required=True, help="the fsdpq adapter directory")
    parser.add_argument("--logits", help="a JSON file from `fsdpq generate --logits_out`")
    parser.add_argument("--merged", help="a directory from `fsdpq merge` of --base and --adapter")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="dtype of the base weights in transformers (default float32)")
    parser.add_argument("--atol", type=float, default=2e-3)
    parser.add_argument("--rtol", type=float, default=1e-3)
    args = parser.parse_args()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = PeftConfig.from_pretrained(args.adapter)
        dtype = getattr(torch, args.dtype)
        base = AutoModelForCausalLM.from_pretrained(args.base, torch_dtype=dtype)
        model = PeftModel.from_pretrained(base, args.adapter)
    # PEFT warns (rather than fails) about config keys it does not know and adapter keys it could not
    # place; for this check those are mismatches. Other warnings are only shown.
    for w in caught:
        text = str(w.message)
        if any(key in text for key in ("Unexpected keyword", "adapter keys", "unexpected keys", "missing keys")):
            fail(f"PEFT warned while loading: {text}")
        else:
            print(f"note: {w.category.__name__}: {text.splitlines()[0] if text else ''}")
    print(f"peft {peft.__version__}: {type(config).__name__} peft_type {config.peft_type} r {config.r} "
          f"lora_alpha {config.lora_alpha} target_modules {sorted(config.target_modules)}")
    if str(config.peft_type) not in ("LORA", "PeftType.LORA"):
        fail(f"peft_type is {config.peft_type}, expected LORA")
    with open(os.path.join(args.adapter, "adapter_config.json")) as f:
        raw = json.load(f)
    if config.r != raw["r"] or config.lora_alpha != raw["lora_alpha"] or set(config.target_modules) != set(raw["target_modules"]):
        fail("PeftConfig read r / lora_alpha / target_modules differently from the file")
    if bool(getattr(config, "use_dora", False)) != bool(raw.get("use_dora", False)):
        fail(f"PeftConfig read use_dora as {getattr(config, 'use_dora', None)}, the file says {raw.get('use_dora')}")
    if raw.get("use_dora"):
        print("DoRA adapter: magnitudes compared like lora_A / lora_B; the merge folds m / ||W + s·B·A|| as PEFT does")

    model.eval()
    check_adapter(model, args.adapter, config)
    if args.logits:
        check_logits(model, args.logits, args.atol, args.rtol)
    if args.merged:
        adapted = set()
        for name in load_file(os.path.join(args.adapter, "adapter_model.safetensors")):
            base_name = name.replace("base_model.model.", "", 1).split(".lora_")[0] + ".weight"
            adapted.add(base_name)
        check_merged(model, args.merged, adapted)

    if failures:
        print(f"FAILED: {len(failures)} mismatch(es)")
        return 1
    print("OK: PEFT loads the fsdpq adapter as written" + (" and agrees on the merge" if args.merged else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
