// The records of a dataset by index: read from a file (and held), or made on demand (dummy,
// synthetic), so that a run that reads a few of a million made records makes only those.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "data/records.h"

namespace fsdpq::data {

class RecordSource {
 public:
  RecordSource() = default;
  static RecordSource held(std::vector<Record> records);
  static RecordSource dummy(int64_t samples, int64_t context_length);     // make_dummy_record
  static RecordSource synthetic(int64_t samples, uint64_t seed);          // SyntheticRecords

  size_t size() const { return end_ - begin_; }
  // Records [begin, end) of this source (the train and eval parts of one dataset).
  RecordSource slice(size_t begin, size_t end) const;
  // Hands the records at `indices` (strictly ascending, each below size()) to `consume` in order, up to
  // `chunk` at a time, with the position in `indices` of the chunk's first: only a chunk of them is
  // held at once (a synthetic record is made from the draws of all before it, so those are made
  // once, in order, and dropped).
  using Consumer = std::function<void(size_t first, const std::vector<Record>& records)>;
  void read(const std::vector<size_t>& indices, size_t chunk, const Consumer& consume) const;
  // The records at `indices`, all at once.
  std::vector<Record> at(const std::vector<size_t>& indices) const;

 private:
  enum class Kind { Held, Dummy, Synthetic };
  Kind kind_ = Kind::Held;
  std::shared_ptr<const std::vector<Record>> held_;
  int64_t context_length_ = 0;  // dummy
  uint64_t seed_ = 0;           // synthetic
  size_t begin_ = 0, end_ = 0;  // this source's records of the whole dataset's
};

}  // namespace fsdpq::data
