#include "data/record_source.h"

#include <algorithm>
#include <functional>
#include <stdexcept>

#include "data/synthetic.h"
#include "util/error.h"

namespace fsdpq::data {

RecordSource RecordSource::held(std::vector<Record> records) {
  RecordSource s;
  s.kind_ = Kind::Held;
  s.end_ = records.size();
  s.held_ = std::make_shared<const std::vector<Record>>(std::move(records));
  return s;
}

RecordSource RecordSource::dummy(int64_t samples, int64_t context_length) {
  if (samples < 1) fail("dataset_samples is {}; the dummy dataset needs at least 1", samples);
  make_dummy_record(context_length, 0);  // checks context_length now, not at the first read
  RecordSource s;
  s.kind_ = Kind::Dummy;
  s.context_length_ = context_length;
  s.end_ = static_cast<size_t>(samples);
  return s;
}

RecordSource RecordSource::synthetic(int64_t samples, uint64_t seed) {
  if (samples < 1) fail("dataset_samples is {}; the synthetic dataset needs at least 1", samples);
  RecordSource s;
  s.kind_ = Kind::Synthetic;
  s.seed_ = seed;
  s.end_ = static_cast<size_t>(samples);
  return s;
}

RecordSource RecordSource::slice(size_t begin, size_t end) const {
  if (begin > end || end > size()) throw std::logic_error("RecordSource::slice: out of range");
  RecordSource s = *this;
  s.begin_ = begin_ + begin;
  s.end_ = begin_ + end;
  return s;
}

void RecordSource::read(const std::vector<size_t>& indices, size_t chunk, const Consumer& consume) const {
  if (std::adjacent_find(indices.begin(), indices.end(), std::greater_equal<>()) != indices.end() ||
      (!indices.empty() && indices.back() >= size()))
    throw std::logic_error("RecordSource::read: indices must be strictly ascending and below size()");
  chunk = std::max<size_t>(chunk, 1);
  SyntheticRecords synthetic(seed_);  // made in order across the chunks
  std::vector<Record> records;
  for (size_t first = 0; first < indices.size(); first += chunk) {
    const size_t end = std::min(indices.size(), first + chunk);
    records.clear();
    for (size_t k = first; k < end; ++k) {
      const size_t i = begin_ + indices[k];  // in the whole dataset
      switch (kind_) {
        case Kind::Held: records.push_back((*held_)[i]); break;
        case Kind::Dummy: records.push_back(make_dummy_record(context_length_, i)); break;
        case Kind::Synthetic:
          while (synthetic.made() < i) synthetic.next();
          records.push_back(synthetic.next());
          break;
      }
    }
    consume(first, records);
  }
}

std::vector<Record> RecordSource::at(const std::vector<size_t>& indices) const {
  std::vector<Record> out;
  read(indices, indices.size(), [&](size_t, const std::vector<Record>& records) { out = records; });
  return out;
}

}  // namespace fsdpq::data
