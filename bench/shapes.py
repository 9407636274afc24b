"""Model shapes and the FLOP convention shared by every peer and by fsdpq's rows (no torch needed).

FLOP convention (per trained token; model FLOPs only, so MFU does not reward recomputation):
  every matmul of m x n weights costs 2*m*n FLOPs per token forward;
  frozen base weights (all seven projections of every layer, and lm_head):
      forward + input-gradient backward = 4 * N_frozen   (no weight gradient: they do not train)
  LoRA adapters (A: in x r, B: r x out on each target module):
      forward + input-gradient + weight-gradient = 6 * N_lora
      (DoRA counts as LoRA: its magnitude and per-step weight norm are not per-token model work)
  trained decoder layers (Llama-Pro's new blocks, trained_layers of the layers): 6 per weight
  attention scores and their use (QK^T and PV, no weights), PaLM's convention:
      12 * layers * ctx * heads * head_dim   (full ctx x ctx, the causal mask's half is NOT subtracted)
  not counted: embedding lookup, norms, RoPE, SwiGLU, softmax, the loss, the optimizer, NF4 dequantize,
  and the forward recomputed under gradient checkpointing (it is real work, but not model work).
MFU = tokens_per_second * flops_per_token / peak, peak = 989 TFLOP/s (H100/H200 SXM dense bf16 datasheet).
"""

# name: hidden, intermediate, layers, heads, kv_heads, vocab, rope_theta (the same numbers as fsdpq's presets)
SHAPES = {
    "tiny": (64, 176, 2, 4, 2, 32000, 10000.0),
    "llama2-7b": (4096, 11008, 32, 32, 32, 32000, 10000.0),
    "llama3-8b": (4096, 14336, 32, 32, 8, 128256, 500000.0),
    "llama2-70b": (8192, 28672, 80, 64, 8, 32000, 10000.0),
}
FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "vocab_size", "rope_theta")

# fsdp_qlora's lora_target_modules=all (fsdpq's `all` too); o_proj gets no adapter.
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "up_proj", "down_proj", "gate_proj")
DEFAULT_PEAK_TFLOPS = 989.0

FLOP_CONVENTION = ("4*N_frozen (fwd + input-grad bwd; all projections + lm_head) + 6*N_lora "
                   "+ 12*layers*ctx*heads*head_dim (attention, full ctx^2); recompute not counted")


def shape_dict(name):
    return dict(zip(FIELDS, SHAPES[name]))


def shape_from_hf_config(cfg):
    """The shape fields of an HF config.json dict (kv heads default to heads, as HF does)."""
    d = {k: cfg.get(k) for k in FIELDS}
    d["num_key_value_heads"] = d["num_key_value_heads"] or d["num_attention_heads"]
    d["rope_theta"] = d["rope_theta"] or cfg.get("rope_parameters", {}).get("rope_theta", 10000.0)
    return d


def flops_per_token(shape, ctx, lora_r=64, targets=LORA_TARGETS, trained_layers=0):
    """trained_layers: of the shape's layers, how many train every weight (Llama-Pro's new blocks)."""
    h, inter, layers = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    heads, kv, vocab = shape["num_attention_heads"], shape["num_key_value_heads"], shape["vocab_size"]
    hd = h // heads
    proj = {"q_proj": (h, heads * hd), "k_proj": (h, kv * hd), "v_proj": (h, kv * hd), "o_proj": (heads * hd, h),
            "gate_proj": (h, inter), "up_proj": (h, inter), "down_proj": (inter, h)}
    per_layer = sum(i * o for i, o in proj.values())
    n_frozen = (layers - trained_layers) * per_layer + h * vocab
    n_trained = trained_layers * per_layer
    n_lora = layers * sum(lora_r * (i + o) for name, (i, o) in proj.items() if name in targets)
    attention = 12 * layers * ctx * heads * hd
    return 4 * n_frozen + 6 * n_trained + 6 * n_lora + attention


def mfu(tokens_per_second, flops, peak_tflops=DEFAULT_PEAK_TFLOPS):
    return tokens_per_second * flops / (peak_tflops * 1e12)
