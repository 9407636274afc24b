#!/usr/bin/env python3
"""Real bitsandbytes NF4 output for fsdpq's byte-for-byte check (src/quant/nf4.h).

Runs bitsandbytes.functional.quantize_4bit(w, blocksize=64, quant_type="nf4") on the GPU, with
compress_statistics False and True, and dequantize_4bit of both, and writes everything as one
blob per case:
  OUT/<case>.bin   the arrays, back to back, little-endian
  OUT/<case>.json  {"arrays": {name: {"offset", "bytes", "dtype", "count", "checksum"}}, ...}
An array larger than --max-inline-bytes is recorded by its checksum only (offset -1). The C++
test tests/unit/quant_nf4_reference_test.cpp reads the folder named by $FSDPQ_NF4_REFERENCE and
compares (it skips when the variable is unset: CI has no GPU and no bitsandbytes).

Inputs:
  --input FILE --dtype bf16|fp32 [--shape R,C]   raw little-endian values (written by the C++
                                                 test's generator, see docs/nf4.md)
  --synthetic R,C --seed S [--dtype fp32]        the deterministic generator below, which the
                                                 C++ test reproduces, so big cases need no file
                                                 (bf16 by default; fp32 skips the bf16 rounding)
Arrays written: nf4_code, dynamic_code, packed, absmax, deq, nested_packed, nested_absmax_q,
nested_scale, nested_offset, nested_absmax (decoded), nested_deq.

  python3 tests/reference/nf4_reference.py --synthetic 4096,4096 --seed 1234 --out DIR
"""
import argparse
import json
import os

import numpy as np
import torch

from reference_checksum import GOLDEN, as_bytes, checksum, mix64


def synthetic_weights(rows, cols, seed, as_bf16=True):
    """Deterministic bf16-representable weights: uniform per row with a per-row scale, 1/256 of the
    values multiplied by 8 (outliers), and block 5 all zeros. Mirrored in the C++ test."""
    n = rows * cols
    with np.errstate(over="ignore"):
        idx = np.arange(n, dtype=np.uint64)
        h = mix64(np.uint64(seed) + (idx + np.uint64(1)) * GOLDEN)
        r = np.arange(rows, dtype=np.uint64)
        hr = mix64((np.uint64(seed) ^ np.uint64(0xABCDEF)) + (r + np.uint64(1)) * GOLDEN)
    row_u = (hr >> np.uint64(40)).astype(np.float64) * 2.0**-24
    row_scale = (0.002 + 0.05 * row_u).astype(np.float32)
    centered = ((h >> np.uint64(40)).astype(np.int64) - (1 << 23)).astype(np.float32) * np.float32(2.0**-23)
    values = centered * np.repeat(row_scale, cols)
    outlier = (h & np.uint64(0xFF)) == np.uint64(0)
    values = np.where(outlier, values * np.float32(8.0), values).astype(np.float32)
    if n >= 6 * 64:
        values[5 * 64:6 * 64] = 0.0
    t = torch.from_numpy(values)
    return t.to(torch.bfloat16) if as_bf16 else t


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--shape")
    ap.add_argument("--synthetic")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--out", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--max-inline-bytes", type=int, default=12 << 20)
    args = ap.parse_args()

    import bitsandbytes as bnb
    import bitsandbytes.functional as F

    if args.synthetic:
        rows, cols = (int(v) for v in args.synthetic.split(","))
        w = synthetic_weights(rows, cols, args.seed).reshape(rows, cols)
        if args.dtype == "fp32":  # the same values before their bf16 rounding
            w = synthetic_weights(rows, cols, args.seed, as_bf16=False).reshape(rows, cols)
        source = {"synthetic": [rows, cols], "seed": args.seed, "dtype": args.dtype}
    else:
        raw = open(args.input, "rb").read()
        np_dtype = {"bf16": np.int16, "fp32": np.float32}[args.dtype]
        arr = torch.from_numpy(np.frombuffer(raw, dtype=np_dtype).copy())
        w = arr.view(torch.bfloat16) if args.dtype == "bf16" else arr
        if args.shape:
            w = w.reshape([int(v) for v in args.shape.split(",")])
        source = {"input": os.path.basename(args.input), "dtype": args.dtype, "shape": list(w.shape)}

    w = w.cuda()
    arrays = {}
    arrays["nf4_code"] = F.get_4bit_type("nf4", device="cuda").float()
    arrays["dynamic_code"] = F.create_dynamic_map(signed=True).float()

    packed, state = F.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=False)
    arrays["packed"] = packed.view(-1)
    arrays["absmax"] = state.absmax
    arrays["deq"] = F.dequantize_4bit(packed, state).reshape(-1)

    npacked, nstate = F.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=True)
    arrays["nested_packed"] = npacked.view(-1)
    arrays["nested_absmax_q"] = nstate.absmax
    arrays["nested_scale"] = nstate.state2.absmax
    arrays["nested_offset"] = nstate.offset.reshape(1).float()
    decoded = F.dequantize_blockwise(nstate.absmax, nstate.state2)
    decoded += nstate.offset
    arrays["nested_absmax"] = decoded.float()
    arrays["nested_deq"] = F.dequantize_4bit(npacked, nstate).reshape(-1)
    torch.cuda.synchronize()

    index = {}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, args.name + ".bin"), "wb") as blob:
        offset = 0
        for name, tensor in arrays.items():
            data = as_bytes(tensor)
            entry = {"dtype": str(tensor.dtype).replace("torch.", ""), "count": tensor.numel(),
                     "bytes": len(data), "checksum": checksum(data), "offset": -1}
            if len(data) <= args.max_inline_bytes:
                blob.write(data)
                entry["offset"] = offset
                offset += len(data)
            index[name] = entry
    meta = {"case": args.name, "source": source, "numel": w.numel(),
            "torch": torch.__version__, "bitsandbytes": bnb.__version__,
            "device": torch.cuda.get_device_name(), "arrays": index}
    with open(os.path.join(args.out, args.name + ".json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"{args.name}: numel {w.numel()}, {len(index)} arrays, bnb {bnb.__version__}")


if __name__ == "__main__":
    main()
