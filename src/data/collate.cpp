#include "data/collate.h"

#include <algorithm>

#include "util/error.h"

namespace fsdpq::data {

Batch collate(const std::vector<const Example*>& examples, int32_t pad_id, int64_t context_length,
              bool pad_to_context_length) {
  if (context_length < 1)
    fail("context_length is {}; expected a positive number of tokens", context_length);
  Batch batch;
  batch.batch_size = static_cast<int64_t>(examples.size());
  if (examples.empty()) return batch;

  int64_t longest = 0;
  for (const Example* e : examples)
    longest = std::max<int64_t>(longest, static_cast<int64_t>(e->input_ids.size()));
  batch.seq_len = pad_to_context_length ? context_length : std::min(longest, context_length);

  const size_t cells = static_cast<size_t>(batch.batch_size * batch.seq_len);
  batch.input_ids.assign(cells, pad_id);
  batch.labels.assign(cells, kIgnoreIndex);
  for (size_t row = 0; row < examples.size(); ++row) {
    const Example& e = *examples[row];
    const size_t n = std::min(e.input_ids.size(), static_cast<size_t>(batch.seq_len));
    const size_t offset = row * static_cast<size_t>(batch.seq_len);
    std::copy_n(e.input_ids.begin(), n, batch.input_ids.begin() + offset);
    std::copy_n(e.labels.begin(), n, batch.labels.begin() + offset);
    for (size_t t = 1; t < n; ++t) batch.target_tokens += e.labels[t] != kIgnoreIndex;
  }
  return batch;
}

}  // namespace fsdpq::data
