// Llama-Pro's block expansion (Wu et al. 2024, "LLaMA Pro"; fsdp_qlora's scripts/block_expansion.py
// and train_type bnb_llama_pro / hqq_llama_pro): `new_blocks` decoder layers added to a checkpoint
// of L, one after every ⌊L / new_blocks⌋ original layers (any left over follow the last new block),
// each a copy of the layer before it with o_proj and down_proj zero. A zero o_proj and down_proj make the block add nothing to the residual
// stream, so the expanded model computes exactly what the original does until the new blocks train.
//
// fsdp_qlora expands offline and writes a new checkpoint; fsdpq expands while loading: the
// expanded model's tensors are read from the original's (the new blocks' from the layer they copy).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/llama_config.h"
#include "model/llama_weights.h"

namespace fsdpq {

class BlockExpansion {
 public:
  // `new_blocks` 0: no expansion. Otherwise fails, naming llama_pro_num_new_blocks and the
  // values allowed, unless fsdp_qlora's placement (a block after every ⌊L / n⌋ layers) adds
  // exactly new_blocks blocks: every divisor of L, and counts such as 3 on 32 layers.
  BlockExpansion(int64_t original_layers, int64_t new_blocks);
  // Why `new_blocks` cannot expand a model of `original_layers` layers ("" when it can).
  static std::string problem(int64_t original_layers, int64_t new_blocks);

  int64_t original_layers() const { return original_layers_; }
  int64_t new_blocks() const { return new_blocks_; }
  int64_t layers() const { return original_layers_ + new_blocks_; }
  // Whether decoder layer `layer` of the expanded model is a new block.
  bool is_new(int64_t layer) const;
  // The original layer whose weights expanded layer `layer` starts from (a new block: the one it copies).
  int64_t source_layer(int64_t layer) const;
  // The new blocks' indices in the expanded model (fsdp_qlora's new_layer_ids), ascending.
  std::vector<int64_t> new_layers() const;
  // The original config with num_hidden_layers = layers().
  LlamaConfig expanded(const LlamaConfig& original) const;

 private:
  int64_t original_layers_ = 0, new_blocks_ = 0;
  int64_t group_ = 1;  // original layers before each new block
};

// The expanded model's initial values from a source of the original's (`original` its config):
// each decoder layer's tensors are its source layer's, the new blocks' o_proj and down_proj zero;
// the other tensors are the original's. The original's tensor index is passed on, so a random
// preset draws the same values as it does unexpanded.
WeightSource expanded_weight_source(const BlockExpansion& expansion, const LlamaConfig& original,
                                    WeightSource original_source);

}  // namespace fsdpq
