#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention, one backend at a time, at the shapes of fsdpq's attention
perf mode (GpuOpsAttentionCudnn.Perf): causal, bf16, B*T = 16k, H 32, D 128, T 512 / 2048 / 8192
(KV 32), and GQA 32/8 at T 2048. Prints one line per backend, pass and shape in the perf mode's
format, so scripts/device_attention.sh tabulates both together:

  PERF attention torch-flash fwd T2048 B8 H32 KV32 D128 bf16: 1.2345 ms, 123.4 TFLOP/s
  PERF attention torch-cudnn bwd T2048 B8 H32 KV8 D128 bf16: declined: <why>

Memory layout as fsdpq's: q, k, v are [B, T, heads, D] tensors seen as [B, heads, T, D] (a
transpose, as HF Llama passes them). Forward timed with autograd recording (as in training: the
backends then keep their logsumexp); backward timed alone, autograd.grad of the same output again
and again (retain_graph). Median of 20 after 3 warm-ups, CUDA events on the current stream.
FLOPs as FlashAttention counts them: forward 4*B*H*T^2*D / 2 (causal), backward 2.5x the forward.
A measurement, never pass/fail. Needs a GPU and torch >= 2.5 (enable_gqa).
"""
import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {
    "torch-flash": SDPBackend.FLASH_ATTENTION,
    "torch-cudnn": SDPBackend.CUDNN_ATTENTION,
    "torch-efficient": SDPBackend.EFFICIENT_ATTENTION,
}


def median_ms(fn, warmup=3, runs=20):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def shape_text(b, t, h, kv, d):
    return f"T{t} B{b} H{h} KV{kv} D{d} bf16"


def report(backend, pass_name, shape, flops, fn):
    try:
        ms = median_ms(fn)
    except RuntimeError as e:  # the backend does not run this shape (no kernel, or unsupported GQA)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"PERF attention {backend} {pass_name} {shape}: declined: {first}", flush=True)
        return False
    print(f"PERF attention {backend} {pass_name} {shape}: {ms:.4f} ms, {flops / ms / 1e9:.1f} TFLOP/s", flush=True)
    return True


def run_case(t, kv, tokens=16384, h=32, d=128, seed=0):
    b = tokens // t
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def leaf(heads, scale):
        x = (torch.rand(b, t, heads, d, device="cuda", generator=gen) * 2 - 1) * scale
        return x.to(torch.bfloat16).requires_grad_(True)

    # q and k in [-2, 2), v and dout in [-1, 1): the inputs of fsdpq's tests.
    q_leaf, k_leaf, v_leaf = leaf(h, 2.0), leaf(kv, 2.0), leaf(kv, 1.0)
    dout = leaf(h, 1.0).detach().transpose(1, 2)
    q, k, v = (x.transpose(1, 2) for x in (q_leaf, k_leaf, v_leaf))
    gqa = kv != h
    fwd_flops = 4.0 * b * h * t * t * d / 2
    shape = shape_text(b, t, h, kv, d)
    for name, backend in BACKENDS.items():
        with sdpa_kernel([backend]):
            def forward():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)

            if not report(name, "fwd", shape, fwd_flops, forward):
                print(f"PERF attention {name} bwd {shape}: declined: no forward", flush=True)
                continue
            out = forward()
            report(name, "bwd", shape, 2.5 * fwd_flops,
                   lambda: torch.autograd.grad(out, (q_leaf, k_leaf, v_leaf), dout, retain_graph=True))
            del out
        torch.cuda.empty_cache()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq", type=int, nargs="*", default=[512, 2048, 8192], help="sequence lengths (KV 32)")
    p.add_argument("--gqa-seq", type=int, nargs="*", default=[2048], help="sequence lengths with KV 8")
    args = p.parse_args()
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}",
          flush=True)
    for t in args.seq:
        run_case(t, 32)
    for t in args.gqa_seq:
        run_case(t, 8)


if __name__ == "__main__":
    main()
