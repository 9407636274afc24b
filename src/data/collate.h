// Stacking examples into one padded [batch_size, seq_len] batch (fsdp_qlora's collate_fn), one
// example per row, or with packing several examples per row (docs/packing.md).
#pragma once
#include <cstdint>
#include <vector>

#include "data/examples.h"

namespace fsdpq::data {

struct Batch {
  int64_t batch_size = 0, seq_len = 0;
  std::vector<int32_t> input_ids;  // row-major [batch_size, seq_len]
  std::vector<int32_t> labels;     // row-major [batch_size, seq_len]
  // Labels != kIgnoreIndex at positions >= 1 of each row: the tokens the shifted next-token loss
  // counts (position 0 is never a target).
  int64_t target_tokens = 0;
  // The examples' own tokens (the rest of the batch_size × seq_len slots are padding).
  int64_t real_tokens = 0;
  // The examples the batch holds: batch_size unpacked, the rows' examples together when packed.
  int64_t examples = 0;
  // Packed rows only (empty otherwise), row-major [batch_size, seq_len]: where each token's example
  // begins in its row (ops/attention.h's segment_start; a padding slot is its own one-token
  // segment) and the token's position within its example (RoPE restarts at 0 per example).
  std::vector<int32_t> segment_start;
  std::vector<int32_t> positions;
  bool packed() const { return !segment_start.empty(); }
};

// Pads every row to the longest example (or to context_length when pad_to_context_length) with
// pad_id in input_ids and kIgnoreIndex in labels, and cuts rows to context_length.
Batch collate(const std::vector<const Example*>& examples, int32_t pad_id, int64_t context_length,
              bool pad_to_context_length);

// Packed rows: rows[r] holds the examples laid end to end in row r (each at most context_length
// tokens, together at most context_length). Rows are padded to the longest row. Each example keeps
// its labels, except that its first token is never a target: the shifted next-token loss does not
// ask the previous example's last token to predict it, just as an unpacked row's position 0 is
// never a target. So a packed batch counts exactly the targets of its examples unpacked.
// pad_to_context_length pads every row to context_length (fixed shapes) instead.
Batch collate_packed(const std::vector<std::vector<const Example*>>& rows, int32_t pad_id, int64_t context_length,
                     bool pad_to_context_length = false);

// padding_free: the examples of an unpacked batch (the same examples, each cut to context_length)
// laid end to end in one row of their total length, each with its own positions, causal attention
// and targets as collate_packed gives them: the batch computes its examples' losses and gradients
// without a padding slot. An empty list gives one padding slot with no target.
Batch collate_padding_free(const std::vector<const Example*>& examples, int32_t pad_id, int64_t context_length);

}  // namespace fsdpq::data
