#include "data/example_set.h"

#include <algorithm>
#include <functional>
#include <stdexcept>
#include <string>

namespace fsdpq::data {

ExampleSet::ExampleSet(std::vector<Example> all) : size_(all.size()), made_(std::move(all)) {}

ExampleSet::ExampleSet(size_t size, std::vector<size_t> indices, std::vector<Example> made, Maker make)
    : size_(size), indices_(std::move(indices)), made_(std::move(made)), make_(std::move(make)) {
  if (indices_.size() != made_.size() ||
      std::adjacent_find(indices_.begin(), indices_.end(), std::greater_equal<>()) != indices_.end() ||
      (!indices_.empty() && indices_.back() >= size_))
    throw std::logic_error("ExampleSet: indices must be strictly ascending, below size, one per example");
  if (complete()) indices_.clear();
}

const Example& ExampleSet::operator[](size_t index) const {
  if (complete() && index < size_) return made_[index];
  const auto it = std::lower_bound(indices_.begin(), indices_.end(), index);
  if (it != indices_.end() && *it == index) return made_[static_cast<size_t>(it - indices_.begin())];
  if (index >= size_ || !make_)
    throw std::logic_error("train example " + std::to_string(index) + " of " + std::to_string(size_) +
                           " was not tokenized, yet the run reads it");
  auto late = made_late_.find(index);
  if (late == made_late_.end()) late = made_late_.emplace(index, make_(index)).first;
  return late->second;
}

}  // namespace fsdpq::data
