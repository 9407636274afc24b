// Stacking examples into one padded [batch_size, seq_len] batch (fsdp_qlora's collate_fn).
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
};

// Pads every row to the longest example (or to context_length when pad_to_context_length) with
// pad_id in input_ids and kIgnoreIndex in labels, and cuts rows to context_length.
Batch collate(const std::vector<const Example*>& examples, int32_t pad_id, int64_t context_length,
              bool pad_to_context_length);

}  // namespace fsdpq::data
