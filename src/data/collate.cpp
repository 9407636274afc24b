#include "data/collate.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "util/error.h"

namespace fsdpq::data {

Batch collate(const std::vector<const Example*>& examples, int32_t pad_id, int64_t context_length,
              bool pad_to_context_length) {
  if (context_length < 1)
    fail("context_length is {}; expected a positive number of tokens", context_length);
  Batch batch;
  batch.batch_size = static_cast<int64_t>(examples.size());
  batch.examples = batch.batch_size;
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
    batch.real_tokens += static_cast<int64_t>(n);
  }
  return batch;
}

namespace {

// Rows of examples laid end to end (each example at most context_length tokens, a row at most
// row_limit), padded to the longest row or to pad_to tokens (0: the longest).
Batch lay_out_rows(const std::vector<std::vector<const Example*>>& rows, int32_t pad_id, int64_t context_length,
                   int64_t row_limit, int64_t pad_to) {
  if (context_length < 1) fail("context_length is {}; expected a positive number of tokens", context_length);
  Batch batch;
  batch.batch_size = static_cast<int64_t>(rows.size());
  for (const auto& row : rows) {
    int64_t used = 0;
    for (const Example* e : row) {
      if (static_cast<int64_t>(e->input_ids.size()) > context_length)
        throw std::logic_error(fmt::format("collate: an example of {} tokens exceeds context_length {}",
                                           e->input_ids.size(), context_length));
      used += static_cast<int64_t>(e->input_ids.size());
    }
    if (used > row_limit)
      throw std::logic_error(fmt::format("collate_packed: a row of {} tokens exceeds context_length {}", used, row_limit));
    batch.seq_len = std::max(batch.seq_len, used);
  }
  if (pad_to > 0) batch.seq_len = pad_to;
  batch.seq_len = std::max<int64_t>(batch.seq_len, 1);  // a rank dealt no row computes one padding slot
  const int64_t T = batch.seq_len;
  const size_t cells = static_cast<size_t>(batch.batch_size * T);
  batch.input_ids.assign(cells, pad_id);
  batch.labels.assign(cells, kIgnoreIndex);
  batch.segment_start.resize(cells);
  batch.positions.assign(cells, 0);
  for (size_t cell = 0; cell < cells; ++cell)  // padding: one-token segments, at position 0
    batch.segment_start[cell] = static_cast<int32_t>(static_cast<int64_t>(cell) % std::max<int64_t>(T, 1));
  for (size_t r = 0; r < rows.size(); ++r) {
    const size_t row_begin = r * static_cast<size_t>(T);
    size_t at = 0;
    for (const Example* e : rows[r]) {
      const size_t n = e->input_ids.size();
      std::copy_n(e->input_ids.begin(), n, batch.input_ids.begin() + static_cast<std::ptrdiff_t>(row_begin + at));
      std::copy_n(e->labels.begin(), n, batch.labels.begin() + static_cast<std::ptrdiff_t>(row_begin + at));
      if (n > 0) batch.labels[row_begin + at] = kIgnoreIndex;  // no target across the boundary
      for (size_t t = 0; t < n; ++t) {
        batch.segment_start[row_begin + at + t] = static_cast<int32_t>(at);
        batch.positions[row_begin + at + t] = static_cast<int32_t>(t);
      }
      for (size_t t = 1; t < n; ++t) batch.target_tokens += e->labels[t] != kIgnoreIndex;
      batch.real_tokens += static_cast<int64_t>(n);
      ++batch.examples;
      at += n;
    }
  }
  return batch;
}

}  // namespace

Batch collate_packed(const std::vector<std::vector<const Example*>>& rows, int32_t pad_id, int64_t context_length,
                     bool pad_to_context_length) {
  return lay_out_rows(rows, pad_id, context_length, context_length, pad_to_context_length ? context_length : 0);
}

Batch collate_padding_free(const std::vector<const Example*>& examples, int32_t pad_id, int64_t context_length) {
  std::vector<const Example*> cut;  // (examples longer than context_length are cut, as collate cuts them)
  std::vector<Example> owned;
  owned.reserve(examples.size());
  int64_t total = 0;
  for (const Example* e : examples) {
    if (static_cast<int64_t>(e->input_ids.size()) > context_length) {
      const auto n = static_cast<std::ptrdiff_t>(context_length);
      owned.push_back(Example{std::vector<int32_t>(e->input_ids.begin(), e->input_ids.begin() + n),
                              std::vector<int32_t>(e->labels.begin(), e->labels.begin() + n)});
      cut.push_back(&owned.back());
    } else {
      cut.push_back(e);
    }
    total += static_cast<int64_t>(cut.back()->input_ids.size());
  }
  return lay_out_rows({cut}, pad_id, context_length, std::max<int64_t>(total, 1), 0);
}

}  // namespace fsdpq::data
