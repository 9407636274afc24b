// `fsdpq init-model`: writes a randomly initialised HF model directory (config.json,
// generation_config.json, bf16 safetensors, optionally tokenizer.model) for benchmarks and tests,
// initialised as transformers' LlamaPreTrainedModel._init_weights does: every Linear and the
// Embedding ~ Normal(0, initializer_range), every RMSNorm weight = 1.
//
// Streams: a 70B model is produced chunk by chunk and never held in memory. Values come from a
// counter-based generator: elements 2p and 2p+1 of tensor t are Box–Muller of
// Threefry-2x32-20(key = fold(seed, t), counter = p), so the output depends only on the seed and
// the tensor's index in hf_tensor_specs order, never on thread count or chunking.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>

#include "model/llama_config.h"

namespace fsdpq {

struct InitModelOptions {
  uint64_t seed = 0;
  // A tokenizer to ship with the model (data::load_tokenizer reads it: a sentencepiece or tiktoken
  // tokenizer.model, a tokenizer.json, or a folder holding them). Its files are copied under their
  // Hugging Face names with the tokenizer_config.json / special_tokens_map.json beside them, and
  // config.json takes its bos / eos ids.
  std::filesystem::path tokenizer_model;
  std::optional<int64_t> vocab_size;      // overrides the config's
  uint64_t max_shard_bytes = 5'000'000'000;
  bool overwrite = false;                 // replace a non-empty out_dir
  int threads = 0;                        // 0: OpenMP's default (all cores)
  // Called after each chunk with (bytes done, bytes total), for a progress bar.
  std::function<void(uint64_t, uint64_t)> progress;
};

// Writes into a temporary sibling of out_dir and renames it into place at the end, so an
// interrupted run never leaves a directory that looks like a complete model.
void init_model(LlamaConfig config, const std::filesystem::path& out_dir, const InitModelOptions& options);

// bf16 bits of Normal(0, stddev) for elements [first, first + out.size()) of stream `stream`
// (the tensor index) under `seed`; any split of a range gives the same values.
void fill_normal_bf16(uint64_t seed, uint64_t stream, uint64_t first, float stddev, std::span<uint16_t> out,
                      int threads = 0);

// The counter-based generator underneath: Threefry-2x32 with 20 rounds (Random123), a keyed
// bijection of the counter (x0, x1), replaced by its output.
void threefry2x32_20(uint32_t key0, uint32_t key1, uint32_t& x0, uint32_t& x1);

}  // namespace fsdpq
