#include "train/epoch_batches.h"

#include <algorithm>

#include "data/packing.h"

namespace fsdpq {

std::vector<std::vector<int64_t>> packed_epoch_rows(const data::ExampleSet& examples,
                                                    const data::DistributedSampler& sampler, int64_t epoch,
                                                    int64_t context_length) {
  const std::vector<int64_t> order = sampler.permutation(epoch);
  std::vector<int64_t> lengths;
  lengths.reserve(order.size());
  for (int64_t index : order)  // examples are already cut to context_length; an empty one takes a slot
    lengths.push_back(std::clamp<int64_t>(
        static_cast<int64_t>(examples[static_cast<size_t>(index)].input_ids.size()), 1, context_length));
  std::vector<std::vector<int64_t>> rows;
  for (const std::vector<size_t>& positions : data::pack_rows(lengths, context_length)) {
    std::vector<int64_t>& row = rows.emplace_back();
    for (size_t p : positions) row.push_back(order[p]);
  }
  return rows;
}

EpochBatches::EpochBatches(const data::ExampleSet& examples, const data::DistributedSampler& sampler,
                           int64_t epoch, const BatchShape& shape, int64_t consumed)
    : examples_(examples), shape_(shape) {
  const auto batch = static_cast<size_t>(shape.batch_size);
  if (!shape.packing) {
    std::vector<int64_t> indices = sampler.indices(epoch);
    const auto drop = static_cast<size_t>(
        std::clamp<int64_t>(consumed / sampler.world_size(), 0, static_cast<int64_t>(indices.size())));
    for (size_t begin = drop; begin < indices.size(); begin += batch) {
      std::vector<Row>& rows = micro_batches_.emplace_back();
      for (size_t k = begin; k < std::min(indices.size(), begin + batch); ++k) rows.push_back({indices[k]});
    }
    return;
  }
  const std::vector<std::vector<int64_t>> all = packed_epoch_rows(examples, sampler, epoch, shape.context_length);
  const size_t per_micro_batch = batch * static_cast<size_t>(sampler.world_size());
  for (size_t begin = static_cast<size_t>(std::clamp<int64_t>(consumed, 0, static_cast<int64_t>(all.size())));
       begin < all.size(); begin += per_micro_batch) {
    const size_t end = std::min(all.size(), begin + per_micro_batch);
    std::vector<int64_t> tokens;
    for (size_t r = begin; r < end; ++r) {
      int64_t n = 0;
      for (int64_t index : all[r]) n += static_cast<int64_t>(examples[static_cast<size_t>(index)].input_ids.size());
      tokens.push_back(n);
    }
    const auto dealt = data::deal_rows(tokens, sampler.world_size(), shape.batch_size);
    std::vector<Row>& mine = micro_batches_.emplace_back();
    for (size_t r : dealt[static_cast<size_t>(sampler.rank())]) mine.push_back(all[begin + r]);
  }
}

data::Batch EpochBatches::batch(int64_t i) const {
  const std::vector<Row>& rows = micro_batches_[static_cast<size_t>(i)];
  if (!shape_.packing) {
    std::vector<const data::Example*> examples;
    for (const Row& row : rows) examples.push_back(&examples_[static_cast<size_t>(row.front())]);
    if (shape_.padding_free) return data::collate_padding_free(examples, shape_.pad_id, shape_.context_length);
    return data::collate(examples, shape_.pad_id, shape_.context_length, shape_.pad_to_context_length);
  }
  // A rank dealt no row (an epoch's last, short micro-batch) computes one padding token with no
  // target: it adds nothing to the gradient and its loss is not counted.
  if (rows.empty()) return data::collate_packed({{}}, shape_.pad_id, shape_.context_length, false);
  std::vector<std::vector<const data::Example*>> packed;
  for (const Row& row : rows) {
    std::vector<const data::Example*>& examples = packed.emplace_back();
    for (int64_t index : row) examples.push_back(&examples_[static_cast<size_t>(index)]);
  }
  return data::collate_packed(packed, shape_.pad_id, shape_.context_length, shape_.pad_to_context_length);
}

std::vector<data::Batch> sequential_batches(const std::vector<data::Example>& examples, int64_t batch_size,
                                            int32_t pad_id, int64_t context_length, bool padding_free) {
  std::vector<data::Batch> batches;
  for (size_t begin = 0; begin < examples.size(); begin += static_cast<size_t>(batch_size)) {
    std::vector<const data::Example*> rows;
    for (size_t k = begin; k < std::min(examples.size(), begin + static_cast<size_t>(batch_size)); ++k)
      rows.push_back(&examples[k]);
    batches.push_back(padding_free ? data::collate_padding_free(rows, pad_id, context_length)
                                   : data::collate(rows, pad_id, context_length, false));
  }
  return batches;
}

}  // namespace fsdpq
