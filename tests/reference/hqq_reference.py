#!/usr/bin/env python3
"""Real hqq output for fsdpq's HQQ check (src/quant/hqq.h, docs/hqq.md).

Quantises deterministic weights exactly as fsdp_qlora's train.py does for train_type hqq_lora:

    quant_config = BaseQuantizeConfig(nbits=n_bits, group_size=64, quant_zero=True,
                                      quant_scale=True, offload_meta=True, view_as_float=True)
    HQQLinear(linear, quant_config, compute_dtype=compute_dtype, device=device, del_orig=True)

(hqq 0.2.8 ignores quant_zero / quant_scale with a warning: the zero points and scales stay in
compute_dtype, stacked as meta["zero_scale"]), and writes per case the packed codes (W_q's bytes),
zero_scale and HQQLinear.dequantize().

Solvers (--solver):
  cpu   hqq on the CPU as installed: its proximal solver works in fp32 there.
  half  hqq on the CPU with the solver's dtype set to float16, which is what hqq does on a GPU
        (optimize_weights_proximal_legacy: "float16 if device.type == 'cuda' else float32"), so
        the CUDA path's arithmetic can be checked without a GPU.
  cuda  hqq on the GPU, the path fsdp_qlora takes (scripts/device_hqq.sh).
On a machine without CUDA, pinning the offloaded meta (Tensor.pin_memory) is made a no-op.

Output (--out DIR): DIR/hqq_<solver>.bin (the arrays back to back) and DIR/hqq_<solver>.json:
  {"cases": [{"name", "shape", "seed", "dtype", "n_bits", "compute_dtype", "solver",
              "arrays": {name: {"offset", "bytes", "checksum"}}}], "torch", "hqq", "device"}
Arrays: codes (W_q's bytes), zero_scale (2 x groups values in compute_dtype: zeros then scales),
deq (the dequantised weight in compute_dtype). An array over --max-inline-bytes has offset -1 and
only its checksum. tests/unit/quant_hqq_reference_test.cpp reproduces the weights and compares.

  python3 tests/reference/hqq_reference.py --solver cpu --out tests/data/hqq
"""
import argparse
import json
import os

import numpy as np
import torch

from reference_checksum import GOLDEN, as_bytes, checksum, mix64


# (rows, cols, seed): 64 groups (3-bit pads 70 rows) and 24 groups (3-bit pads 30 rows).
SHAPES = [(16, 256, 11), (24, 64, 12)]
N_BITS = [1, 2, 3, 4, 8]


def synthetic_weights(rows, cols, seed):
    """Deterministic fp32 weights, mirrored in the C++ test: a cubed uniform (heavy tails) times a
    per-row power of two, and groups that exercise hqq's edge cases: group 0 all zero, group 1
    constant (max - min = 0: scale 1), group 2 all positive (zero point near 0), group 3 a range
    below 1e-4 (scale 1)."""
    n = rows * cols
    with np.errstate(over="ignore"):
        idx = np.arange(n, dtype=np.uint64)
        h = mix64(np.uint64(seed) + (idx + np.uint64(1)) * GOLDEN)
    centered = ((h >> np.uint64(40)).astype(np.int64) - (1 << 23)).astype(np.float32) * np.float32(2.0**-23)
    cubed = (centered * centered).astype(np.float32) * centered
    row_shift = (np.arange(rows) % 4).astype(np.float32)
    values = (cubed * np.repeat(np.float32(2.0) ** -(row_shift + 3), cols)).astype(np.float32)
    values[0:64] = 0.0
    values[64:128] = np.float32(0.01)
    values[128:192] = np.abs(values[128:192])
    values[192:256] = np.float32(1e-3) + centered[192:256] * np.float32(2.0**-16)
    return values.reshape(rows, cols)


def quantize(weights, dtype, n_bits, compute_dtype, device):
    from hqq.core.quantize import BaseQuantizeConfig, HQQLinear

    rows, cols = weights.shape
    linear = torch.nn.Linear(cols, rows, bias=False)
    linear.weight.data = torch.from_numpy(weights).to(dtype=dtype, device=device)
    config = BaseQuantizeConfig(nbits=n_bits, group_size=64, quant_zero=True, quant_scale=True,
                                offload_meta=True, view_as_float=True)
    layer = HQQLinear(linear, config, compute_dtype=compute_dtype, device=device, del_orig=True)
    return {"codes": layer.W_q.data, "zero_scale": layer.meta["zero_scale"], "deq": layer.dequantize()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--solver", choices=["cpu", "half", "cuda"], required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-inline-bytes", type=int, default=4096)
    args = ap.parse_args()

    import hqq
    import hqq.core.optimize

    device = "cuda" if args.solver == "cuda" else "cpu"
    if args.solver == "half":
        hqq.core.optimize.float32 = torch.float16  # the solver's dtype off the GPU
    if not torch.cuda.is_available():
        torch.Tensor.pin_memory = lambda self, *a, **k: self

    cases = []
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"hqq_{args.solver}.bin"), "wb") as blob:
        offset = 0
        for rows, cols, seed in SHAPES:
            weights = synthetic_weights(rows, cols, seed)
            for dtype_name, dtype, compute_dtype in [("bf16", torch.bfloat16, torch.bfloat16),
                                                     ("fp32", torch.float32, torch.float16)]:
                for n_bits in N_BITS:
                    arrays = quantize(weights, dtype, n_bits, compute_dtype, device)
                    index = {}
                    for name, tensor in arrays.items():
                        data = as_bytes(tensor)
                        entry = {"bytes": len(data), "checksum": checksum(data), "offset": -1}
                        if len(data) <= args.max_inline_bytes:
                            blob.write(data)
                            entry["offset"] = offset
                            offset += len(data)
                        index[name] = entry
                    cases.append({"name": f"{rows}x{cols}_{dtype_name}_{n_bits}bit", "shape": [rows, cols],
                                  "seed": seed, "dtype": dtype_name, "n_bits": n_bits,
                                  "compute_dtype": str(compute_dtype).replace("torch.", ""),
                                  "solver": args.solver, "arrays": index})
    meta = {"torch": torch.__version__, "hqq": hqq.__version__,
            "device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "cases": cases}
    with open(os.path.join(args.out, f"hqq_{args.solver}.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"hqq {hqq.__version__} ({args.solver} solver): {len(cases)} cases, {offset} bytes inline")


if __name__ == "__main__":
    main()
