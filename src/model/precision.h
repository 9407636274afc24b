// The `precision` setting: what a run computes and stores in.
#pragma once
#include <string>

#include "util/dtype.h"

namespace fsdpq {

// fsdp_qlora's precision modes (config key `precision`).
//  fp32: weights, activations and math in fp32.
//  bf16: activations and frozen weights bf16; trainable weights stored bf16 for compute with
//        fp32 masters and fp32 optimizer state (fsdp_qlora keeps them in bf16; fp32 masters
//        avoid updates vanishing below bf16's resolution).
//  bf16_autocast / bf16_buffers_autocast: fp32 trainable weights, bf16 compute (the latter
//        keeps RoPE tables fp32, which fsdpq always does) — same numerics as bf16 here.
//  fp16_autocast: fp32 trainable weights (and fp32 loading, as fsdp_qlora's torch_dtype float32),
//        fp16 compute: activations, frozen dense weights and dequantised NF4 in half storage
//        (fp32 math, one rounding per store); the trainer scales the loss dynamically and skips
//        steps whose gradients overflow.
enum class Precision { FP32, BF16, BF16Autocast, BF16BuffersAutocast, FP16Autocast };
Precision parse_precision(const std::string& name);
DType activation_dtype(Precision precision);

// What the backward keeps activation gradients in (the residual stream's and each layer's): the
// activations' own type where that is bf16, as autocast and FSDP's bf16 mixed precision keep them
// (the kernels still sum in fp32 and round once per store), and fp32 otherwise. fp16 keeps fp32:
// fsdpq's loss scaler guards the weight gradients, and fp16's 5-bit exponent would put the
// activation gradients of long sequences at its edges. Weight gradients are fp32 in every precision.
DType activation_grad_dtype(DType activation);

}  // namespace fsdpq
