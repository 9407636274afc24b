// Which decoder layers a training pass with gradient checkpointing recomputes in its backward: the
// one rule the model (llama_model.cpp) and the memory plan (plan/memory_plan.cpp) both follow.
// Layer i is recomputed when i % checkpoint_every == 0 (1: every layer, fsdp_qlora's), unless it
// is among the last keep_activation_layers, which keep their forward's activations. The backward
// meets the last layers first, so memory that fits some kept layers buys their recompute back
// one layer at a time, where checkpoint_every halves the recomputed layers at once.
#pragma once
#include <cstdint>

namespace fsdpq {

struct CheckpointPolicy {
  bool checkpointing = false;
  int64_t every = 1;      // checkpoint_every, at least 1
  int64_t keep_last = 0;  // keep_activation_layers, at least 0

  bool recomputes(int64_t layer, int64_t layers) const {
    return checkpointing && layer % every == 0 && layer < layers - keep_last;
  }
  int64_t recomputed_layers(int64_t layers) const {
    int64_t n = 0;
    for (int64_t i = 0; i < layers; ++i) n += recomputes(i, layers) ? 1 : 0;
    return n;
  }
  // The last layer it recomputes (-1: none). Its activations are still in the buffer the recomputed
  // layers share when its backward begins, so it is not recomputed after all.
  int64_t last_recomputed(int64_t layers) const {
    for (int64_t i = layers - 1; i >= 0; --i)
      if (recomputes(i, layers)) return i;
    return -1;
  }
  // Whether layer i's recompute stops at h (model/llama_layer.h's layer_recompute): every recomputed
  // layer's but the last one's, except under DoRA, whose recompute runs the whole layer.
  bool recompute_stops_at_h(int64_t layer, int64_t layers, bool dora) const {
    return !dora && recomputes(layer, layers) && layer != last_recomputed(layers);
  }
  // With use_activation_cpu_offload, whether layer i's att, lse and x2 wait in host memory between
  // its forward and backward (model/activation_offload.h): a recomputed layer's whose recompute stops
  // at h, and a kept layer's, but the last layer's (its backward comes first).
  bool offloads_attention_output(int64_t layer, int64_t layers, bool dora) const {
    if (!checkpointing) return false;
    return recompute_stops_at_h(layer, layers, dora) || (!recomputes(layer, layers) && layer != layers - 1);
  }
};

}  // namespace fsdpq
