#include "config/options.h"

#include <algorithm>

namespace fsdpq {
namespace {

using T = TrainConfig;
constexpr double kNoMax = std::numeric_limits<double>::infinity();

// One entry per key, in the order docs and --print-config show them. Long because it is a table,
// not logic: each entry is read on its own, and splitting it would only scatter the keys.
std::vector<OptionSpec> build_specs() {
  return {
      // ---- [model] -------------------------------------------------------------------------
      {"model_name", "model", OptionType::String, &T::model_name, "preset:llama2-7b",
       "An HF-format model directory (config.json + safetensors) or `preset:NAME` for a "
       "random-initialised model of a known shape (benchmarks; `fsdpq init-model` writes one to disk). "
       "Presets: tiny, tinyllama-1.1b, llama2-7b, llama2-13b, llama2-70b, llama3-8b, llama3-70b, "
       "llama3.1-8b, llama3.2-1b, llama3.2-3b, mistral-7b, codellama-34b, yi-34b."},
      {"tokenizer_path", "model", OptionType::String, &T::tokenizer_path, "",
       "A `tokenizer.model` (sentencepiece, or Meta's tiktoken for Llama-3), a Hugging Face "
       "`tokenizer.json`, or a folder holding one. Empty: the model directory's. `builtin:bytes`: a "
       "byte-level tokenizer that needs no file.",
       {}, -kNoMax, kNoMax, {}, "builtin:bytes"},
      {"train_type", "model", OptionType::Enum, &T::train_type, "qlora",
       "What trains. full: every weight (fp32 masters). lora: LoRA adapters over a frozen bf16 base. "
       "qlora: LoRA over a frozen NF4 base (bitsandbytes layout). hqq_lora: LoRA over a frozen HQQ "
       "base of n_bits bits (hqq's layout, docs/hqq.md). bnb_dora / hqq_dora: DoRA (PEFT's "
       "use_dora: LoRA plus a trainable magnitude per output row, docs/dora.md) over an NF4 / HQQ "
       "base. bnb_llama_pro / hqq_llama_pro: Llama-Pro block expansion, llama_pro_num_new_blocks new "
       "decoder layers train (bf16, fp32 masters) over the frozen NF4 / HQQ model (docs/llama_pro.md). "
       "custom_lora / custom_qlora are fsdp_qlora's names for lora / qlora.",
       {"full", "lora", "qlora", "custom_lora", "custom_qlora", "hqq_lora", "bnb_dora", "hqq_dora", "bnb_llama_pro",
        "hqq_llama_pro"},
       -kNoMax, kNoMax},
      {"n_bits", "model", OptionType::Int, &T::n_bits, "4",
       "Bits per base weight under train_type hqq_lora, hqq_dora and hqq_llama_pro: 1, 2, 3, 4 or 8 (hqq's "
       "widths; groups of 64 values, a zero point and a scale each). Other train types take only 4, as fsdp_qlora.",
       {}, 1, 8},
      {"llama_pro_num_new_blocks", "model", OptionType::Int, &T::llama_pro_num_new_blocks, "0",
       "bnb_llama_pro / hqq_llama_pro: decoder layers Llama-Pro adds (required there, unused elsewhere). "
       "One new block goes after every floor(L / n) of the model's L layers (fsdp_qlora's block_expansion.py; "
       "layers left over follow the last), a copy of the layer before it with o_proj and down_proj zero "
       "(LLaMA-Pro-8B: 8 on Llama-2-7B's 32; fsdp_qlora's expansion_rate 0.1 on 32 layers: 3). fsdpq "
       "expands while loading; fsdp_qlora's llama_pro_path folder made by block_expansion.py "
       "(blk_exp-L-M) is n = M - L on the original model_name.",
       {}, 0, 1048576},
      {"precision", "model", OptionType::Enum, &T::precision, "bf16",
       "Numerics. fp32: everything fp32. bf16: weights, activations and grads in bf16 with fp32 "
       "accumulation (trainable masters fp32). bf16_autocast / bf16_buffers_autocast: fp32 "
       "trainable weights, bf16 compute (the latter keeps RoPE buffers fp32). fp16_autocast: fp16 "
       "compute with dynamic loss scaling.",
       {"fp32", "bf16", "bf16_autocast", "bf16_buffers_autocast", "fp16_autocast"}},
      {"loss_scale_init", "model", OptionType::Float, &T::loss_scale_init, "65536",
       "fp16_autocast: the dynamic loss scale to start from (torch.amp.GradScaler's init_scale); "
       "halved on every step whose gradients overflow (the step is skipped).", {}, 1.0, 1e38},
      {"loss_scale_growth_interval", "model", OptionType::Int, &T::loss_scale_growth_interval, "2000",
       "fp16_autocast: clean steps in a row after which the loss scale doubles (GradScaler's "
       "growth_interval).", {}, 1, kNoMax},

      // ---- [lora] --------------------------------------------------------------------------
      {"lora_rank", "lora", OptionType::Int, &T::lora_rank, "64", "LoRA rank r.", {}, 1, 65536},
      {"lora_alpha", "lora", OptionType::Float, &T::lora_alpha, "16",
       "LoRA alpha; the adapter output is scaled by alpha / r.", {}, 1e-12, kNoMax},
      {"lora_dropout", "lora", OptionType::Float, &T::lora_dropout, "0.1",
       "Dropout on the adapter input, training only.", {}, 0.0, 0.99},
      {"lora_target_modules", "lora", OptionType::List, &T::lora_target_modules, "all",
       "Linear layers that get adapters: `all` (k_proj, q_proj, v_proj, up_proj, down_proj, "
       "gate_proj, as fsdp_qlora), `default` (q_proj, v_proj), or a comma-separated list.",
       {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}, -kNoMax, kNoMax,
       {}, "all, default"},

      // ---- [data] --------------------------------------------------------------------------
      {"dataset", "data", OptionType::Enum, &T::dataset, "alpaca_sample",
       "alpaca / alpaca_sample (instruction, input, output), sql (context, question, answer; "
       "qna prompt), orca_math (question, answer), guanaco (text), all read from `data_path`; "
       "dummy (fsdp_qlora's fixed-length records) and synthetic (a generated, learnable task mix) "
       "need no file.",
       {"alpaca", "alpaca_sample", "sql", "orca_math", "guanaco", "dummy", "synthetic"}},
      {"data_path", "data", OptionType::InputFile, &T::data_path, "",
       "Local JSONL or JSON-array file with the dataset's records (fsdpq downloads nothing)."},
      {"dataset_samples", "data", OptionType::Int, &T::dataset_samples, "128",
       "Records used by alpaca_sample (the first N), dummy and synthetic.", {}, 1, kNoMax},
      {"context_length", "data", OptionType::Int, &T::context_length, "512",
       "Examples are truncated to this many tokens.", {}, 2, 1048576},
      {"pad_to_context_length", "data", OptionType::Bool, &T::pad_to_context_length, "false",
       "Pad every batch to context_length (fixed shapes for benchmarks) instead of to its longest example "
       "(with packing: every row instead of to the longest row)."},
      {"packing", "data", OptionType::Bool, &T::packing, "false",
       "Concatenate examples into rows of up to context_length tokens (first-fit decreasing within windows of "
       "1024 examples of the shuffled order), each example with its own positions and causal attention; "
       "batch_size then counts rows. Pays when examples are much shorter than context_length "
       "(docs/packing.md). false: one example per row, as fsdp_qlora."},
      {"padding_free", "data", OptionType::Bool, &T::padding_free, "false",
       "Without packing: lay each batch's examples end to end in one row instead of padding each to the longest, "
       "each with its own positions and causal attention. The same examples per step and the same loss as "
       "fsdp_qlora's padded rows, with no padding computed (docs/packing.md). packing and pad_to_context_length "
       "take precedence over it (a warning says so)."},
      {"skip_bad_records", "data", OptionType::Bool, &T::skip_bad_records, "false",
       "Skip and count malformed records instead of stopping at the first one."},
      {"eval_data_path", "data", OptionType::InputFile, &T::eval_data_path, "",
       "Held-out records (same format as data_path) for evaluation."},
      {"eval_fraction", "data", OptionType::Float, &T::eval_fraction, "0",
       "Fraction of the training records held out for evaluation instead of eval_data_path.", {}, 0.0, 0.5},
      {"eval_every_steps", "data", OptionType::Int, &T::eval_every_steps, "0",
       "Evaluate every N optimizer steps (0: only at the end, when there is eval data).", {}, 0, kNoMax},

      // ---- [training] ----------------------------------------------------------------------
      {"batch_size", "training", OptionType::Int, &T::batch_size, "1", "Examples per rank per micro-step.", {}, 1, 65536},
      {"gradient_accumulation_steps", "training", OptionType::Int, &T::gradient_accumulation_steps, "1",
       "Micro-steps per optimizer step.", {}, 1, 65536},
      {"num_epochs", "training", OptionType::Int, &T::num_epochs, "1", "Passes over the dataset.", {}, 1, 100000},
      {"max_steps", "training", OptionType::Int, &T::max_steps, "-1",
       "Stop after this many optimizer steps (-1: no limit).", {}, -1, kNoMax},
      {"seed", "training", OptionType::Int, &T::seed, "42",
       "Seeds data order, LoRA init, dropout and random-initialised presets.", {}, 0, 4294967295.0},
      {"optimizer", "training", OptionType::Enum, &T::optimizer, "adamw",
       "adamw (betas 0.9/0.95, eps 1e-5, decoupled wd), adam, sgd, adadelta (torch defaults); "
       "fused_adam / fused_adamw are the same math.",
       {"adamw", "adam", "sgd", "adadelta", "fused_adam", "fused_adamw"}},
      {"lr", "training", OptionType::Float, &T::lr, "1e-5", "Peak learning rate.", {}, 1e-300, 10.0},
      {"wd", "training", OptionType::Float, &T::wd, "0.1", "AdamW weight decay.", {}, 0.0, 10.0},
      {"lr_scheduler", "training", OptionType::Enum, &T::lr_scheduler, "constant",
       "constant, linear (10% warm-up, then down to 0) or cosine (10% warm-up, one cycle down to "
       "min_lr_fraction), with fsdp_qlora's formulas.",
       {"constant", "linear", "cosine"}},
      {"min_lr_fraction", "training", OptionType::Float, &T::min_lr_fraction, "0.1",
       "Cosine schedule floor as a fraction of lr.", {}, 0.0, 1.0},
      {"apply_gradient_clipping", "training", OptionType::Bool, &T::apply_gradient_clipping, "false",
       "Clip gradients to a global L2 norm of grad_norm."},
      {"grad_norm", "training", OptionType::Float, &T::grad_norm, "0.3", "Clipping threshold.", {}, 1e-12, kNoMax},

      // ---- [sharding] ----------------------------------------------------------------------
      {"sharding_strategy", "sharding", OptionType::Enum, &T::sharding_strategy, "full_shard",
       "full_shard (params, grads, optimizer sharded; params gathered per unit in forward and "
       "backward), shard_grad_op (params stay gathered from forward to backward), ddp (replicated, "
       "all-reduce), hybrid_full_shard / hybrid_shard_grad_op (shard within a node, replicate across nodes).",
       {"full_shard", "shard_grad_op", "ddp", "hybrid_full_shard", "hybrid_shard_grad_op"}},
      {"use_gradient_checkpointing", "sharding", OptionType::Bool, &T::use_gradient_checkpointing, "true",
       "Keep only each decoder layer's input and recompute the layer in backward."},
      {"checkpoint_every", "sharding", OptionType::Int, &T::checkpoint_every, "1",
       "With use_gradient_checkpointing: recompute every k-th decoder layer (layers 0, k, 2k, ...) and "
       "keep the other layers' activations, trading memory for speed (torchtitan's selective layer "
       "checkpointing). 1 recomputes every layer (fsdp_qlora's); `fsdpq plan` predicts the memory.",
       {}, 1, 1 << 20},
      {"keep_activation_layers", "sharding", OptionType::Int, &T::keep_activation_layers, "0",
       "With use_gradient_checkpointing: the last n decoder layers keep their activations from the "
       "forward instead of being recomputed in backward (with checkpoint_every, among the layers it "
       "recomputes). Each costs one layer's activations and saves one layer's forward; unlike "
       "checkpoint_every it buys the recompute back a layer at a time, to fill whatever memory is left. "
       "`fsdpq plan` predicts the memory and fills it this way.",
       {}, 0, 1 << 20},
      {"recompute_elementwise", "sharding", OptionType::Bool, &T::recompute_elementwise, "false",
       "Selective recompute: the decoder layers that keep their activations (all of them without "
       "use_gradient_checkpointing) drop the outputs of their two RMSNorms and of SwiGLU and recompute "
       "them in backward, keeping every GEMM's output: ~30% less activation memory for ~1% more time, "
       "the same results bit for bit. `fsdpq plan` predicts the memory and weighs it against "
       "checkpointing."},
      {"keep_dequantized_layers", "sharding", OptionType::Int, &T::keep_dequantized_layers, "0",
       "Quantised bases (qlora, hqq_lora and their DoRA forms): the last k decoder layers are made dense "
       "once, by the first pass, and keep their dense base weights for every later pass instead of "
       "dequantising them again (a frozen base never changes; a 7B layer's: 0.4 GiB in bf16, both of each "
       "step's dequantisations of it saved). 0 (fsdp_qlora's): every pass dequantises; above the number "
       "of layers: all of them. `fsdpq plan` predicts the memory.",
       {}, 0, 1 << 20},
      {"use_cpu_offload", "sharding", OptionType::Bool, &T::use_cpu_offload, "false",
       "Keep params, grads and optimizer state in pinned host memory: each layer's weights are copied "
       "in just ahead of use, and each unit is stepped on a CPU thread as its backward ends. "
       "Off by default (fsdp_qlora: on): it only pays when the model does not fit on the GPUs."},
      {"use_activation_cpu_offload", "sharding", OptionType::Bool, &T::use_activation_cpu_offload, "false",
       "With checkpointing, keep the layer inputs, and most layers' attention outputs, in pinned host memory "
       "between forward and backward, copied beside the compute: less GPU memory (the layers not recomputed "
       "hold less too), and a recompute that skips attention and o_proj (host memory: about three layer inputs "
       "a layer)."},
      {"low_memory", "sharding", OptionType::Bool, &T::low_memory, "true",
       "Each rank reads only its own shards from the model files (never the whole model)."},
      {"no_sync", "sharding", OptionType::Bool, &T::no_sync, "false",
       "Skip gradient reduction on all but the last micro-step of an accumulation."},
      {"ranks_per_node", "sharding", OptionType::Int, &T::ranks_per_node, "0",
       "Ranks that form one node for hybrid sharding (0: ranks sharing memory, as MPI reports).", {}, 0, 65536},
      {"collective_timeout_s", "sharding", OptionType::Float, &T::collective_timeout_s, "600",
       "Seconds a rank may wait in a collective (or for its GPU) before the watchdog asks the other ranks "
       "what they are doing and, unless the one it waits for still makes progress, ends the job naming the "
       "rank that stalled (exit code 76). 0 waits forever. NCCL's and PyTorch's default is 10 minutes.",
       {}, 0.0, kNoMax},
      {"world_size", "sharding", OptionType::Int, &T::world_size, "-1",
       "Expected number of ranks (-1: whatever the launcher started); a mismatch is an error.", {}, -1, 1048576},

      // ---- [checkpoint] --------------------------------------------------------------------
      {"save_every_steps", "checkpoint", OptionType::Int, &T::save_every_steps, "0",
       "Write a checkpoint every N optimizer steps (0: never).", {}, 0, kNoMax},
      {"checkpoint_dir", "checkpoint", OptionType::OutputPath, &T::checkpoint_dir, "",
       "Where checkpoints go (empty: output_dir/checkpoints)."},
      {"keep_last", "checkpoint", OptionType::Int, &T::keep_last, "2", "Checkpoints kept on disk.", {}, 1, kNoMax},
      {"resume", "checkpoint", OptionType::String, &T::resume, "",
       "Continue a run: `auto` (the latest checkpoint in checkpoint_dir, if any) or a checkpoint file.",
       {}, -kNoMax, kNoMax, {}, "auto"},
      {"overwrite", "checkpoint", OptionType::Bool, &T::overwrite, "false",
       "A run without `resume` refuses an output_dir (or checkpoint_dir) that holds a previous run's "
       "metrics or checkpoints; true removes those files first (`resume = auto` continues the run instead)."},
      {"resume_ignore_model", "checkpoint", OptionType::Bool, &T::resume_ignore_model, "false",
       "Continue a checkpoint although it was made from other base weights or another tokenizer (their "
       "fingerprints differ); the shapes must still match."},

      // ---- [output] ------------------------------------------------------------------------
      {"save_model", "output", OptionType::Bool, &T::save_model, "false",
       "Save the trained adapters (PEFT layout) or, for train_type full, the model, into output_dir."},
      {"output_dir", "output", OptionType::OutputPath, &T::output_dir, "output",
       "Run directory: metrics.jsonl, logs, saved model."},
      {"log_to", "output", OptionType::Enum, &T::log_to, "tqdm",
       "tqdm (a progress bar on a terminal, plain lines otherwise), stdout (plain lines) or file "
       "(output_dir/train.log only). metrics.jsonl is always written.",
       {"tqdm", "stdout", "file"}, -kNoMax, kNoMax,
       {{"wandb", "Weights & Biases needs the network; use tqdm, stdout or file and the metrics.jsonl"}}},
      {"verbose", "output", OptionType::Bool, &T::verbose, "false", "Print per-rank details."},
      {"profile", "output", OptionType::Bool, &T::profile, "false",
       "Write a chrome-trace / Perfetto timeline of each step's phases, gathers, reductions and CPU-offload "
       "worker jobs (analysis/offload_trace.py sums those): "
       "output_dir/trace.rank<R>.json per rank."},
      {"profile_memory", "output", OptionType::Bool, &T::profile_memory, "false",
       "Also write a memory record to metrics.jsonl before and after every micro-batch's pass and after "
       "every optimizer step, not only at fsdp_qlora's checkpoints."},
      {"dry_run", "output", OptionType::Bool, &T::dry_run, "false",
       "Load and check everything, print the plan (config, model, dataset, batches) and stop."},
  };
}

}  // namespace

const std::vector<OptionSpec>& option_specs() {
  static const std::vector<OptionSpec> specs = build_specs();
  return specs;
}

const OptionSpec* find_option(std::string_view name) {
  for (const auto& spec : option_specs())
    if (spec.name == name) return &spec;
  return nullptr;
}

std::vector<std::string> option_names() {
  std::vector<std::string> names;
  for (const auto& spec : option_specs()) names.emplace_back(spec.name);
  return names;
}

std::string_view option_type_name(OptionType type) {
  switch (type) {
    case OptionType::Bool: return "bool";
    case OptionType::Int: return "integer";
    case OptionType::Float: return "number";
    case OptionType::String: return "string";
    case OptionType::Enum: return "choice";
    case OptionType::List: return "list";
    case OptionType::InputFile: return "input file";
    case OptionType::OutputPath: return "output path";
  }
  return "?";
}

}  // namespace fsdpq
