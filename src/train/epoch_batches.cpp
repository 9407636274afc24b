#include "train/epoch_batches.h"

#include <algorithm>

namespace fsdpq {

EpochBatches::EpochBatches(const data::ExampleSet& examples, const data::DistributedSampler& sampler,
                           int64_t epoch, int64_t batch_size, int32_t pad_id, int64_t context_length,
                           bool pad_to_context_length, int64_t skip)
    : examples_(examples),
      indices_(sampler.indices(epoch)),
      batch_size_(static_cast<size_t>(batch_size)),
      pad_id_(pad_id),
      context_length_(context_length),
      pad_to_context_length_(pad_to_context_length) {
  const auto drop = static_cast<size_t>(std::clamp<int64_t>(skip, 0, static_cast<int64_t>(indices_.size())));
  indices_.erase(indices_.begin(), indices_.begin() + static_cast<std::ptrdiff_t>(drop));
}

data::Batch EpochBatches::batch(int64_t i) const {
  std::vector<const data::Example*> rows;
  size_t begin = static_cast<size_t>(i) * batch_size_;
  size_t end = std::min(indices_.size(), begin + batch_size_);
  for (size_t k = begin; k < end; ++k) rows.push_back(&examples_[static_cast<size_t>(indices_[k])]);
  return data::collate(rows, pad_id_, context_length_, pad_to_context_length_);
}

std::vector<data::Batch> sequential_batches(const std::vector<data::Example>& examples, int64_t batch_size,
                                            int32_t pad_id, int64_t context_length) {
  std::vector<data::Batch> batches;
  for (size_t begin = 0; begin < examples.size(); begin += static_cast<size_t>(batch_size)) {
    std::vector<const data::Example*> rows;
    for (size_t k = begin; k < std::min(examples.size(), begin + static_cast<size_t>(batch_size)); ++k)
      rows.push_back(&examples[k]);
    batches.push_back(data::collate(rows, pad_id, context_length, false));
  }
  return batches;
}

}  // namespace fsdpq
