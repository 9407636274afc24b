#!/usr/bin/env python3
"""One peer configuration of the side-by-side benchmark: build the model, train, print ONE JSON line.

Peers (all HF transformers LlamaForCausalLM, SDPA attention, PEFT LoRA r64 a16 dropout 0.1 on
q,k,v,gate,up,down, AdamW lr 1e-5 betas 0.9/0.95 eps 1e-5 as fsdp_qlora, random tokens, labels = inputs,
or with --examples FILE fsdpq's own training examples, padded per batch as fsdp_qlora pads them):
  hf_lora_eager    bf16 base, eager PyTorch
  hf_lora_compile  the same, decoder layers (or the whole model) under torch.compile
  hf_qlora_bnb     bitsandbytes Linear4bit base: NF4, double quant, bf16 compute, bf16 quant storage
                   (fsdp_qlora's train_type qlora; with --model DIR: BitsAndBytesConfig + from_pretrained)
  hf_lora_liger    hf_lora_eager with Liger-Kernel's Triton kernels (apply_liger_kernel_to_llama: RoPE,
                   RMSNorm, SwiGLU and the fused linear cross entropy, which never materialises logits)
--liger adds Liger-Kernel's kernels to any peer (e.g. hf_lora_compile or hf_qlora_bnb).
--examples FILE (from `fsdpq examples CONFIG.ini --out FILE`): consecutive batches of --batch-size examples
in file order, cycling, each padded to its longest example (peer_examples.py); the JSON line adds tokens
(padded slots), real_tokens and real_tokens_per_second over the timed steps.
The FLOP count behind "mfu" is stated in shapes.py. stdout carries only the JSON line (library prints
are sent to stderr); exit 0 measured, 3 out of memory (JSON has "oom": true), 1 any other error.
"""
import argparse
import contextlib
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_examples import ExamplesFileError, check_vocab, example_batches, read_examples
from shapes import (DEFAULT_PEAK_TFLOPS, FLOP_CONVENTION, LORA_TARGETS, SHAPES, flops_per_token, mfu,
                    shape_dict, shape_from_hf_config)

PEERS = ("hf_lora_eager", "hf_lora_compile", "hf_qlora_bnb", "hf_lora_liger")
GIB = 1024 ** 3


def log(msg):
    print(f"[peer_train] {msg}", file=sys.stderr, flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--peer", required=True, choices=PEERS)
    p.add_argument("--shape", default="llama2-7b", choices=sorted(SHAPES))
    p.add_argument("--model", help="an HF model directory (its weights) instead of a random --shape")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--context-length", type=int, default=512,
                   help="random tokens: every row's length; --examples: the cut (rows are padded per batch)")
    p.add_argument("--examples", metavar="FILE",
                   help="train on these examples (fsdpq examples CONFIG.ini --out FILE) instead of random tokens")
    p.add_argument("--grad-ckpt", action=argparse.BooleanOptionalAction, default=True,
                   help="gradient checkpointing of every decoder layer (non-reentrant, as fsdp_qlora)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (compile, allocator, optimizer state)")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--lora-r", type=int, default=64)
    p.add_argument("--lora-alpha", type=float, default=16)
    p.add_argument("--lora-dropout", type=float, default=0.1)
    p.add_argument("--lora-dtype", choices=("bf16", "fp32"), default="bf16",
                   help="adapter weights (PEFT's default would upcast them to fp32: slower adapter GEMMs)")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--compile-scope", choices=("layers", "model"), default="layers",
                   help="hf_lora_compile: compile each decoder layer (one graph, quick) or the whole model")
    p.add_argument("--liger", action="store_true", help="Liger-Kernel's kernels for any peer (hf_lora_liger implies it)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--peak-tflops", type=float, default=DEFAULT_PEAK_TFLOPS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", metavar="FILE",
                   help="run the last timed step under torch.profiler and write its operators' GPU times, largest "
                        "first, to FILE (that step's time includes the profiler's overhead)")
    return p.parse_args(argv)


def import_bnb():
    try:
        import bitsandbytes
        return bitsandbytes
    except ImportError as e:
        raise SystemExit(f"hf_qlora_bnb needs bitsandbytes ({e}); on the GPU machine bench.py installs it "
                         "from .device/wheels (bench/fetch_peer_wheels.sh puts it there)")


def apply_liger(rec):
    """Liger-Kernel's Llama kernels, patched into transformers' modeling_llama before the model is built."""
    try:
        import liger_kernel
        from liger_kernel.transformers import apply_liger_kernel_to_llama
    except ImportError as e:
        raise SystemExit(f"--liger needs liger-kernel ({e}); on the GPU machine bench.py installs it "
                         "from .device/wheels (bench/fetch_peer_wheels.sh puts it there)")
    apply_liger_kernel_to_llama(rope=True, rms_norm=True, swiglu=True, fused_linear_cross_entropy=True)
    rec["liger_kernel"] = getattr(liger_kernel, "__version__", None) or version_of("liger-kernel")


def version_of(dist):
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def quantize_linears(module, bnb, torch):
    """Swap every nn.Linear of one decoder layer for an NF4 double-quant Linear4bit holding its weights."""
    found = [(parent, name, child) for parent in module.modules()
             for name, child in parent.named_children() if isinstance(child, torch.nn.Linear)]
    for parent, name, lin in found:
        q = bnb.nn.Linear4bit(lin.in_features, lin.out_features, bias=lin.bias is not None, device="meta",
                              compute_dtype=torch.bfloat16, compress_statistics=True, quant_type="nf4",
                              quant_storage=torch.bfloat16)
        # Params4bit quantizes when it is moved to a device (bitsandbytes' own path, used by fsdp_qlora too).
        q.weight = bnb.nn.Params4bit(lin.weight.data, requires_grad=False, quant_type="nf4", blocksize=64,
                                     compress_statistics=True, quant_storage=torch.bfloat16,
                                     module=q).to(lin.weight.device)
        setattr(parent, name, q)


def build_random_model(args, shape, torch, device):
    """A random-initialised Llama of `shape`, built one decoder layer at a time.

    For QLoRA each layer is quantized as soon as it exists, so no shape (70B included) is ever whole in
    bf16 on the GPU, and nothing goes through disk or host memory."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer
    layers = shape["num_hidden_layers"]
    cfg = LlamaConfig(**{**shape, "num_hidden_layers": 0}, max_position_embeddings=max(4096, args.context_length),
                      use_cache=False, tie_word_embeddings=False, attn_implementation="sdpa")
    bnb = import_bnb() if args.peer == "hf_qlora_bnb" else None
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # as from_pretrained(dtype=bf16) builds (RoPE's inv_freq stays fp32)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg)  # embeddings, final norm, RoPE, lm_head; no layers yet
            for i in range(layers):
                layer = LlamaDecoderLayer(cfg, layer_idx=i)  # torch's default (random uniform) init
                if bnb is not None:
                    quantize_linears(layer, bnb, torch)
                model.model.layers.append(layer)
    finally:
        torch.set_default_dtype(old)
    cfg.num_hidden_layers = layers  # the forward iterates layers[:num_hidden_layers]
    if bnb is not None:
        model.is_loaded_in_4bit = True  # what fsdp_qlora sets, so PEFT dispatches its bnb LoRA layer
    return model


def build_pretrained_model(args, torch, device):
    from transformers import LlamaForCausalLM
    kw = {}
    if args.peer == "hf_qlora_bnb":
        import_bnb()
        from transformers import BitsAndBytesConfig
        kw["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_quant_storage=torch.bfloat16)
    return LlamaForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16, attn_implementation="sdpa",
                                            use_cache=False, device_map={"": device}, **kw)


def load_examples(args, shape, rec):
    """--examples FILE's examples, checked against the model's vocabulary; their counts go into `rec`."""
    try:
        examples = read_examples(args.examples)
        check_vocab(examples, shape["vocab_size"], args.examples)
    except ExamplesFileError as e:
        raise SystemExit(str(e)) from None
    rec.update(examples_file=args.examples, examples_in_file=len(examples), examples_per_step=args.batch_size)
    log(f"{len(examples):,} examples from {args.examples}")
    return examples


def record_example_steps(args, shape, rec, times, timed):
    """tokens (padded slots, what fsdp_qlora counts) and real_tokens over the timed steps, and their rates.
    FLOPs are counted per step at that step's padded length: the model computes every slot."""
    seconds = sum(times)
    tokens = sum(slots for _, slots, _ in timed)
    real = sum(r for _, _, r in timed)
    flops = sum(slots * flops_per_token(shape, seq_len, args.lora_r) for seq_len, slots, _ in timed)
    rec.update(tokens=tokens, real_tokens=real,
               tokens_per_second=tokens / seconds if seconds else None,
               real_tokens_per_second=real / seconds if seconds else None,
               flops_per_token=flops / tokens if tokens else None,
               step_seq_lens=[seq_len for seq_len, _, _ in timed])


def step_profiler(args, torch, cuda, step):
    """torch.profiler for the last timed step when --profile asks for it, else None."""
    if not args.profile or step != args.warmup + args.steps - 1:
        return None
    from torch.profiler import ProfilerActivity, profile
    return profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []))


def write_profile(path, profiler, rec, cuda):
    """The profiled step's operators and kernels, by their own GPU time (CPU time without a GPU)."""
    averages = profiler.key_averages()
    table = None
    keys = ("self_device_time_total", "self_cuda_time_total") if cuda else ()  # newest torch's name first
    for key in keys + ("self_cpu_time_total",):
        try:
            table = averages.table(sort_by=key, row_limit=80, max_name_column_width=90)
            break
        except (AttributeError, KeyError, ValueError):
            continue
    with open(path, "w") as f:
        f.write(f"# {rec['peer']} {rec['model_shape']} bs {rec['batch_size']} ctx {rec['context_length']} "
                f"grad-ckpt {rec['gradient_checkpointing']}: the last timed step under torch.profiler\n")
        f.write(table if table is not None else "(no sortable profiler table in this torch)\n")
    log(f"profile of the last step written to {path}")


def run(args, rec):
    if args.model:
        with open(os.path.join(args.model, "config.json")) as f:
            shape = shape_from_hf_config(json.load(f))
    else:
        shape = shape_dict(args.shape)
    examples = load_examples(args, shape, rec) if args.examples else None  # a bad file stops before torch loads
    import torch
    import transformers
    import peft
    rec.update(torch=torch.__version__, transformers=transformers.__version__, peft=peft.__version__)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("--device cuda but torch sees no GPU (use --device cpu for a smoke test)")
    if not cuda:
        log("not a GPU: a smoke test of the code path, no measurement")
    if cuda:
        rec["gpu"] = torch.cuda.get_device_name(device)
    torch.manual_seed(args.seed)
    if args.liger or args.peer == "hf_lora_liger":
        apply_liger(rec)  # before the model exists: it swaps modeling_llama's classes and forward

    if args.model:
        model = build_pretrained_model(args, torch, device)
    else:
        model = build_random_model(args, shape, torch, device)
    if args.peer == "hf_qlora_bnb":
        import bitsandbytes
        rec["bitsandbytes"] = bitsandbytes.__version__
    if args.grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if cuda:
        log(f"model built: {torch.cuda.memory_allocated(device) / GIB:.2f} GiB allocated")

    from peft import LoraConfig, TaskType, get_peft_model
    lcfg = LoraConfig(task_type=TaskType.CAUSAL_LM, r=args.lora_r, lora_alpha=args.lora_alpha,
                      lora_dropout=args.lora_dropout, target_modules=list(LORA_TARGETS))
    model = get_peft_model(model, lcfg)
    trainable = [p for p in model.parameters() if p.requires_grad]
    lora_dtype = torch.bfloat16 if args.lora_dtype == "bf16" else torch.float32
    for p in trainable:
        p.data = p.data.to(lora_dtype)
    log(f"{sum(p.numel() for p in trainable):,} trainable parameters ({args.lora_dtype})")
    model.train()

    forward = model
    if args.peer == "hf_lora_compile":
        if args.compile_scope == "model":
            forward = torch.compile(model)
        else:
            for layer in model.get_base_model().model.layers:
                layer.compile()
    opt = torch.optim.AdamW(trainable, lr=args.lr, betas=(0.9, 0.95), eps=1e-5)

    bs, ctx = args.batch_size, args.context_length
    if examples is None:
        gen = torch.Generator(device=device).manual_seed(args.seed)
        # A few distinct random batches, reused round-robin: fresh data without timing the sampler.
        randoms = [torch.randint(0, shape["vocab_size"], (bs, ctx), device=device, generator=gen) for _ in range(4)]
        batches = [(ids, ids, bs * ctx, bs * ctx) for ids in randoms]  # (input_ids, labels, slots, real tokens)
    else:
        # Every step its own batch, on the device before the timing starts (as the random ones).
        batches = [(torch.tensor(b.input_ids, device=device), torch.tensor(b.labels, device=device), b.tokens,
                    b.real_tokens)
                   for b in example_batches(examples, bs, args.warmup + args.steps, ctx)]

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    times, timed, loss = [], [], None
    for step in range(args.warmup + args.steps):
        if step == args.warmup and cuda:
            sync()
            torch.cuda.reset_peak_memory_stats(device)  # the steady state, not compile-time extras
        ids, labels, slots, real = batches[step % len(batches)]
        profiler = step_profiler(args, torch, cuda, step)
        sync()
        t0 = time.perf_counter()
        with profiler or contextlib.nullcontext():
            # No attention_mask, as fsdp_qlora's train.py (its forward passes attention_mask=None): rows are
            # padded on the right, so under the causal mask no real token sees a pad, and pads carry no label.
            loss = forward(input_ids=ids, labels=labels).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync()
        dt = time.perf_counter() - t0
        if profiler is not None:
            write_profile(args.profile, profiler, rec, cuda)
        kind = "warm-up" if step < args.warmup else "timed"
        log(f"step {step + 1}/{args.warmup + args.steps} ({kind}): {dt:.3f} s, loss {loss.item():.4f}")
        if step >= args.warmup:
            times.append(dt)
            timed.append((ids.shape[1], slots, real))

    if examples is None:
        flops = flops_per_token(shape, ctx, args.lora_r)
        tps = bs * ctx * len(times) / sum(times) if times else None
    else:
        record_example_steps(args, shape, rec, times, timed)
        flops, tps = rec["flops_per_token"], rec["tokens_per_second"]
    rec.update(tokens_per_second=tps, flops_per_token=flops,
               mfu=mfu(tps, flops, args.peak_tflops) if tps else None,
               steps_timed=len(times), step_seconds=[round(t, 5) for t in times],
               final_loss=loss.item() if loss is not None else None)
    if loss is not None and not math.isfinite(rec["final_loss"]):
        log("warning: the loss is not finite (random weights); the timing stands")


def main(argv=None):
    args = parse_args(argv)
    # Keep stdout for the one JSON line: whatever else writes to fd 1 (libraries, compilers) goes to stderr.
    json_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    rec = {"peer": args.peer, "model_shape": args.model or args.shape, "batch_size": args.batch_size,
           "context_length": args.context_length, "gradient_checkpointing": args.grad_ckpt,
           "lora_r": args.lora_r, "lora_alpha": args.lora_alpha, "lora_dropout": args.lora_dropout,
           "lora_dtype": args.lora_dtype, "liger": args.liger or args.peer == "hf_lora_liger", "device": args.device, "peak_tflops": args.peak_tflops,
           "flop_convention": FLOP_CONVENTION, "warmup_steps": args.warmup, "oom": False,
           "tokens_per_second": None, "mfu": None, "flops_per_token": None,
           "peak_allocated_gib": None, "peak_reserved_gib": None, "steps_timed": 0, "step_seconds": []}
    code = 0
    try:
        run(args, rec)
    except SystemExit as e:  # our own clear refusals
        rec["error"], code = str(e.code), 1
    except Exception as e:  # noqa: BLE001 — every failure becomes a JSON line, OOM is a result
        text = f"{type(e).__name__}: {e}"
        if "OutOfMemoryError" in type(e).__name__ or "out of memory" in text.lower():
            rec["oom"], code = True, 3
            log(f"out of memory: {text.splitlines()[0][:300]}")
        else:
            import traceback
            traceback.print_exc()
            rec["error"], code = text[:500], 1
    if "torch" in sys.modules and args.device.startswith("cuda"):
        torch = sys.modules["torch"]
        if torch.cuda.is_available():
            rec["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / GIB, 3)
            rec["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / GIB, 3)
    if rec.get("error"):
        log(f"error: {rec['error']}")
    json_out.write(json.dumps(rec) + "\n")
    json_out.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
