// The train examples of a dataset by index, of which only those a run reads may have been
// tokenized ahead (docs/data.md, "What a run tokenizes").
#pragma once
#include <cstddef>
#include <functional>
#include <map>
#include <vector>

#include "data/examples.h"

namespace fsdpq::data {

class ExampleSet {
 public:
  using Maker = std::function<Example(size_t index)>;

  ExampleSet() = default;
  // Every example: index i is all[i].
  explicit ExampleSet(std::vector<Example> all);
  // `size` examples of which those at `indices` (strictly ascending) were made ahead, in that
  // order; any other is made by `make` when it is first read (without one, reading it is a bug).
  ExampleSet(size_t size, std::vector<size_t> indices, std::vector<Example> made, Maker make = {});

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  size_t tokenized() const { return made_.size(); }  // made ahead
  bool complete() const { return made_.size() == size_; }
  // Makes an example not made ahead (one reader at a time: the training loop); std::logic_error
  // when there is no maker. The reference stays valid as long as the set.
  const Example& operator[](size_t index) const;
  // The examples made ahead, in index order (all of them when complete()).
  const std::vector<Example>& tokenized_examples() const { return made_; }

 private:
  size_t size_ = 0;
  std::vector<size_t> indices_;  // empty when complete(): index i is made_[i]
  std::vector<Example> made_;
  Maker make_;
  mutable std::map<size_t, Example> made_late_;  // a map: references to its examples stay valid
};

}  // namespace fsdpq::data
