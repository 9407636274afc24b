#!/usr/bin/env python3
"""Checks that a model directory written by fsdpq (init-model, or a full-model save) loads in
Hugging Face transformers exactly as written.

    python3 tests/reference/check_hf_load.py MODEL_DIR [MODEL_DIR ...] [--seed N] [--no-forward]

For each directory: AutoConfig reads config.json into LlamaConfig / MistralConfig with the same
sizes; AutoModelForCausalLM loads the weights without initialising any tensor itself; the parameter
count equals the count from the config; every tensor of the model equals the safetensors contents
bit for bit; and (unless --no-forward) a short forward pass gives finite logits. With --seed, the
values of every tensor (up to --max-check per tensor) are also compared with fsdpq's documented
generator (Threefry-2x32-20 + Box-Muller, see docs/model_files.md) evaluated here in double
precision: equal, or one bf16 step apart where fsdpq's float32 polynomials round the other way
(allowed for at most 0.1% of the values). Needs torch, transformers and safetensors.
Prints a short report; exits 1 on any mismatch.
"""
import argparse
import json
import math
import os
import struct
import sys

import torch
import transformers
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM


def expected_param_count(cfg):
    """The parameter count from config.json alone (fsdpq's count_params, written independently)."""
    hidden, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or hidden // heads
    vocab = cfg["vocab_size"]
    attention = 2 * heads * head_dim * hidden + 2 * kv_heads * head_dim * hidden
    per_layer = attention + 3 * inter * hidden + 2 * hidden
    head = 0 if cfg.get("tie_word_embeddings", False) else vocab * hidden
    return vocab * hidden + layers * per_layer + hidden + head


def safetensors_files(model_dir):
    single = os.path.join(model_dir, "model.safetensors")
    if os.path.exists(single):
        return [single]
    with open(os.path.join(model_dir, "model.safetensors.index.json")) as f:
        index = json.load(f)
    return [os.path.join(model_dir, name) for name in sorted(set(index["weight_map"].values()))]


# ---- fsdpq's generator, in double precision -----------------------------------------------------
MASK = 0xFFFFFFFF


def threefry2x32_20(k0, k1, x0, x1):
    rotations = ((13, 15, 26, 6), (17, 29, 16, 24))
    ks = (k0, k1, k0 ^ k1 ^ 0x1BD11BDA)
    x0, x1 = (x0 + k0) & MASK, (x1 + k1) & MASK
    for group in range(5):
        for r in rotations[group % 2]:
            x0 = (x0 + x1) & MASK
            x1 = ((x1 << r) | (x1 >> (32 - r))) & MASK
            x1 ^= x0
        x0 = (x0 + ks[(group + 1) % 3]) & MASK
        x1 = (x1 + ks[(group + 2) % 3] + group + 1) & MASK
    return x0, x1


def bf16_bits(value):
    u = struct.unpack("<I", struct.pack("<f", value))[0]
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def generated_bf16(seed, tensor_index, count, stddev):
    """bf16 bit patterns of the first `count` elements of tensor `tensor_index` under `seed`,
    element by element in plain Python (the readable reference for the torch version below)."""
    k0, k1 = threefry2x32_20(seed & MASK, seed >> 32, tensor_index & MASK, tensor_index >> 32)
    out = []
    for pair in range((count + 1) // 2):
        x0, x1 = threefry2x32_20(k0, k1, pair & MASK, pair >> 32)
        u1 = ((x0 >> 8) + 1) / 2.0**24
        u2 = (x1 >> 8) / 2.0**24
        r = math.sqrt(-2.0 * math.log(u1)) * stddev
        out += [bf16_bits(r * math.cos(2 * math.pi * u2)), bf16_bits(r * math.sin(2 * math.pi * u2))]
    return out[:count]


def generated_bf16_torch(seed, tensor_index, count, stddev):
    """The same as generated_bf16, vectorized with int64 / float64 torch tensors: an int64 tensor of
    bf16 bit patterns (0..65535)."""
    k0, k1 = threefry2x32_20(seed & MASK, seed >> 32, tensor_index & MASK, tensor_index >> 32)
    k2 = k0 ^ k1 ^ 0x1BD11BDA
    ks = (k0, k1, k2)
    pairs = torch.arange((count + 1) // 2, dtype=torch.int64)
    x0 = (pairs & MASK) + k0 & MASK
    x1 = (pairs >> 32) + k1 & MASK
    for group in range(5):
        for r in ((13, 15, 26, 6), (17, 29, 16, 24))[group % 2]:
            x0 = (x0 + x1) & MASK
            x1 = ((x1 << r) | (x1 >> (32 - r))) & MASK
            x1 = x1 ^ x0
        x0 = (x0 + ks[(group + 1) % 3]) & MASK
        x1 = (x1 + ks[(group + 2) % 3] + group + 1) & MASK
    u1 = ((x0 >> 8) + 1).double() / 2.0**24
    u2 = (x1 >> 8).double() / 2.0**24
    r = torch.sqrt(-2.0 * torch.log(u1)) * stddev
    z = torch.stack([r * torch.cos(2 * math.pi * u2), r * torch.sin(2 * math.pi * u2)], dim=1).reshape(-1)[:count]
    u = z.float().view(torch.int32).long() & MASK
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def bf16_values(bits):
    """float64 values of an int64 tensor of bf16 bit patterns."""
    return (bits << 16).to(torch.int32).view(torch.float32).double()


def compare_with_generator(got_bits, want_bits, stddev):
    """Counts (exact, one bf16 step, near-zero slack, bad). fsdpq evaluates log/sqrt/sin/cos as float32
    polynomials with absolute errors of a few 1e-7 (times r <= 5.8), so its value may round to the
    neighbouring bf16 value, and a value within ~1e-6 sigma of zero may even change sign; anything
    further is a mismatch."""
    got, want = bf16_values(got_bits), bf16_values(want_bits)
    diff = (got - want).abs()
    _, exponent = torch.frexp(torch.maximum(got.abs(), want.abs()))
    ulp = torch.ldexp(torch.ones_like(got), (exponent - 8).to(torch.int32))  # bf16 keeps 8 significant bits
    exact = diff == 0
    one_step = ~exact & (diff <= ulp)
    near_zero = ~exact & ~one_step & (diff <= ulp + 1e-5 * stddev)
    bad = ~(exact | one_step | near_zero)
    return int(exact.sum()), int(one_step.sum()), int(near_zero.sum()), int(bad.sum())


# ---- The checks ---------------------------------------------------------------------------------
def check(model_dir, seed, forward, max_check, problems):
    def problem(message):
        problems.append(f"{model_dir}: {message}")
        print(f"  MISMATCH: {message}")

    print(f"== {model_dir}")
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    hf_config = AutoConfig.from_pretrained(model_dir)
    print(f"  config: {type(hf_config).__name__}, model_type {hf_config.model_type}")
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "vocab_size", "max_position_embeddings", "rms_norm_eps",
                "tie_word_embeddings"):
        if getattr(hf_config, key) != cfg[key]:
            problem(f"config {key}: transformers reads {getattr(hf_config, key)!r}, file has {cfg[key]!r}")
    if getattr(hf_config, "head_dim", None) not in (None, cfg["head_dim"]):
        problem(f"config head_dim: transformers reads {hf_config.head_dim}, file has {cfg['head_dim']}")

    major = int(transformers.__version__.split(".")[0])
    dtype_arg = {"dtype": torch.bfloat16} if major >= 5 else {"torch_dtype": torch.bfloat16}
    model = AutoModelForCausalLM.from_pretrained(model_dir, **dtype_arg)
    model.eval()
    print(f"  model: {type(model).__name__}, transformers {transformers.__version__}, torch {torch.__version__}")

    n_params = sum(p.numel() for p in model.parameters())
    expected = expected_param_count(cfg)
    print(f"  parameters: {n_params:,} (expected from config.json {expected:,})")
    if n_params != expected:
        problem(f"parameter count {n_params:,} != {expected:,}")

    file_tensors = {}
    for path in safetensors_files(model_dir):
        with safe_open(path, framework="pt") as f:
            if (f.metadata() or {}).get("format") != "pt":
                problem(f"{os.path.basename(path)}: metadata format is not 'pt'")
            for name in f.keys():
                file_tensors[name] = f.get_tensor(name)
    file_numel = sum(t.numel() for t in file_tensors.values())
    if file_numel != expected:
        problem(f"safetensors hold {file_numel:,} elements, expected {expected:,}")

    state = model.state_dict()
    names = [n for n in state if not n.endswith("rotary_emb.inv_freq")]
    missing = [n for n in names if n not in file_tensors and not (n == "lm_head.weight" and cfg["tie_word_embeddings"])]
    extra = [n for n in file_tensors if n not in state]
    for n in missing:
        problem(f"model tensor {n} is not in the safetensors files")
    for n in extra:
        problem(f"safetensors tensor {n} is not a model tensor")
    unequal = 0
    for n in names:
        source = file_tensors.get(n)
        if source is None and n == "lm_head.weight":
            source = file_tensors.get("model.embed_tokens.weight")  # tied
        if source is None:
            continue
        got = state[n]
        if got.dtype != torch.bfloat16 or source.dtype != torch.bfloat16:
            problem(f"{n}: dtype {got.dtype} in the model, {source.dtype} in the file")
        elif got.shape != source.shape or not torch.equal(got.cpu(), source):
            unequal += 1
            problem(f"{n}: loaded values differ from the file")
    print(f"  tensors: {len(names)} in the model, {len(file_tensors)} in the files, {unequal} differ")

    if seed is not None:
        # Tensor index = position in HF order (embed, layers..., norm, lm_head), as init-model numbers them.
        order = ["model.embed_tokens.weight"]
        for i in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{i}."
            order += [p + "input_layernorm.weight"] + [p + f"self_attn.{m}_proj.weight" for m in "qkvo"]
            order += [p + "post_attention_layernorm.weight"] + [p + f"mlp.{m}_proj.weight" for m in ("gate", "up", "down")]
        order += ["model.norm.weight"] + ([] if cfg["tie_word_embeddings"] else ["lm_head.weight"])
        totals = [0, 0, 0, 0]  # exact, one step, near zero, bad
        for index, name in enumerate(order):
            tensor = file_tensors[name]
            if name.endswith("norm.weight"):
                if not torch.all(tensor == 1):
                    problem(f"{name}: RMSNorm weight is not all ones")
                continue
            count = min(max_check, tensor.numel())
            got = tensor.reshape(-1)[:count].view(torch.int16).long() & 0xFFFF
            want = generated_bf16_torch(seed, index, count, cfg["initializer_range"])
            if index == 0:  # the vectorized generator agrees with the element-by-element one
                if want[:16].tolist() != generated_bf16(seed, 0, min(16, count), cfg["initializer_range"]):
                    problem("the torch and plain-Python generators disagree (a bug in this script)")
            counts = compare_with_generator(got, want, cfg["initializer_range"])
            if counts[3]:
                problem(f"{name}: {counts[3]:,} values differ from the documented generator")
            totals = [t + c for t, c in zip(totals, counts)]
        compared = sum(totals)
        print(f"  generator (seed {seed}): {compared:,} values compared: {totals[0]:,} equal, {totals[1]:,} one bf16 "
              f"step off, {totals[2]:,} within 1e-5 sigma of the exact value near zero, {totals[3]:,} differ")
        if totals[1] > compared // 1000:
            problem(f"{totals[1]:,} of {compared:,} values are one bf16 step off the generator (over 0.1%)")

    if forward:
        ids = torch.tensor([[cfg.get("bos_token_id") or 1, 5, 17, 42, 7]]) % cfg["vocab_size"]
        with torch.no_grad():
            logits = model(input_ids=ids).logits
        finite = bool(torch.isfinite(logits).all())
        print(f"  forward: logits {tuple(logits.shape)}, finite {finite}, std {logits.float().std().item():.4f}")
        if not finite or tuple(logits.shape) != (1, ids.shape[1], cfg["vocab_size"]):
            problem("forward pass gave non-finite logits or the wrong shape")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dirs", nargs="+")
    parser.add_argument("--seed", type=int, help="also compare with the generator for this init-model seed")
    parser.add_argument("--max-check", type=int, default=1 << 22,
                        help="with --seed, compare at most this many values of each tensor (default 4Mi)")
    parser.add_argument("--no-forward", dest="forward", action="store_false", help="skip the forward pass")
    args = parser.parse_args()
    problems = []
    for d in args.model_dirs:
        try:
            check(d, args.seed, args.forward, args.max_check, problems)
        except Exception as e:  # a load failure is a mismatch too, reported with the rest
            problems.append(f"{d}: {type(e).__name__}: {e}")
            print(f"  FAILED: {type(e).__name__}: {e}")
    print(f"\n{len(args.model_dirs)} model(s) checked, {len(problems)} problem(s)")
    for p in problems:
        print(f"  - {p}")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
