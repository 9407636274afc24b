#include "model/unit_build.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <stdexcept>

namespace fsdpq {
namespace {

std::atomic<int64_t> read_nanoseconds{0}, encode_nanoseconds{0};

// Adds the wall time of its scope to one of the counters above.
class Timed {
 public:
  explicit Timed(std::atomic<int64_t>& total) : total_(total), start_(std::chrono::steady_clock::now()) {}
  ~Timed() {
    total_ += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_).count();
  }
  Timed(const Timed&) = delete;
  Timed& operator=(const Timed&) = delete;

 private:
  std::atomic<int64_t>& total_;
  std::chrono::steady_clock::time_point start_;
};

// The weight's `ranges`, concatenated, in `dtype`. Not zero-filled first: the reader writes every
// byte, and a one-thread fill of a 7B weight's values cost about as long as reading them.
std::unique_ptr<uint8_t[]> read_ranges(const UnitReader& reader, const BaseWeight& w, DType dtype,
                                       const ElementRanges& ranges) {
  const auto bytes = static_cast<size_t>(element_count(ranges)) * dtype_size(dtype);
  auto values = std::make_unique_for_overwrite<uint8_t[]>(bytes);
  size_t at = 0;
  for (const ElementRange& r : ranges) {
    reader.read_frozen(w, r.first, r.count, values.get() + at);
    at += static_cast<size_t>(r.count) * dtype_size(dtype);
  }
  return values;
}

}  // namespace

UnitBuildTimes unit_build_times() {
  return {static_cast<double>(read_nanoseconds.load()) * 1e-9, static_cast<double>(encode_nanoseconds.load()) * 1e-9};
}

UnitBuild::UnitBuild(const ParamUnit& unit, const UnitReader& reader, std::vector<FrozenPiece> frozen,
                     const std::vector<MasterPiece>& masters)
    : unit_(unit), frozen_(std::move(frozen)) {
  size_t count = 0;
  for (const BaseWeight* w : unit.frozen) {
    statistics_at_.push_back(count);
    count += static_cast<size_t>(w->frozen.format().statistics_count(w->frozen.numel()));
  }
  statistics_.assign(count, kUnknownStatistic);

  for (size_t k = 0; k < frozen_.size(); ++k) {
    const FrozenPiece& piece = frozen_[k];
    const BaseWeight& w = *unit.frozen.at(piece.weight);
    const FrozenFormat& format = w.frozen.format();
    const SegmentSpec& spec = w.frozen.segments().at(piece.segment);
    if (spec.from_statistics) continue;  // finish()
    const DType dtype = reader.frozen_dtype(w);
    if (!format.accepts_values(dtype))
      throw std::logic_error(fmt::format("UnitBuild: '{}' is stored as {} but its values come as {}", w.name,
                                         format.name(), dtype_name(dtype)));
    const int segment = static_cast<int>(piece.segment);
    const ElementRanges ranges = format.values_for(segment, w.frozen.numel(), piece.from, piece.to);
    if (ranges.size() == 1 && format.stores_values_as_read(segment, piece.from, piece.to, dtype)) {
      const Timed timed(read_nanoseconds);
      reader.read_frozen(w, ranges[0].first, ranges[0].count, piece.out);
      continue;
    }
    std::unique_ptr<uint8_t[]> read;
    const uint8_t* values = held_values(piece.weight, dtype, ranges);
    if (!values) {
      const Timed timed(read_nanoseconds);
      read = read_ranges(reader, w, dtype, ranges);
      values = read.get();
    }
    const Timed timed(encode_nanoseconds);
    float* statistics = statistics_.data() + statistics_at_[piece.weight];
    if (spec.needs_scalars) {
      format.measure_values(segment, w.frozen.numel(), piece.from, piece.to, values, dtype, statistics);
      waiting_.push_back({k, dtype, ranges, std::move(read), values});  // for finish(), once the scalars are known
    } else {
      format.encode_values(segment, w.frozen.numel(), piece.from, piece.to, values, dtype, piece.out, statistics);
    }
  }
  for (const MasterPiece& piece : masters)
    reader.read_master(*unit.trainable.at(piece.tensor), piece.first, piece.count, piece.out);
}

const uint8_t* UnitBuild::held_values(size_t weight, DType dtype, const ElementRanges& ranges) const {
  if (ranges.size() != 1) return nullptr;  // only HQQ's codes want several, and they come first
  const ElementRange& want = ranges[0];
  for (const WaitingPiece& held : waiting_) {
    if (frozen_[held.piece].weight != weight || held.dtype != dtype) continue;
    int64_t at = 0;  // elements before each of its ranges in its values
    for (const ElementRange& r : held.ranges) {
      if (want.first >= r.first && want.first + want.count <= r.first + r.count)
        return held.values + static_cast<size_t>(at + (want.first - r.first)) * dtype_size(dtype);
      at += r.count;
    }
  }
  return nullptr;
}

void UnitBuild::finish() {
  const Timed timed(encode_nanoseconds);
  for (size_t k = 0; k < unit_.frozen.size(); ++k) {
    FrozenStorage& storage = unit_.frozen[k]->frozen;
    const int64_t n = storage.format().statistics_count(storage.numel());
    if (n == 0) continue;
    const float* stats = statistics_.data() + statistics_at_[k];
    if (std::any_of(stats, stats + n, [](float v) { return v == kUnknownStatistic; }))
      throw std::logic_error(fmt::format("UnitBuild: some values of '{}' were read by no rank", unit_.frozen[k]->name));
    storage.scalars = storage.format().scalars_from(stats, storage.numel());
  }
  for (const FrozenPiece& piece : frozen_) {
    const FrozenStorage& storage = unit_.frozen.at(piece.weight)->frozen;
    if (!storage.segments().at(piece.segment).from_statistics) continue;
    storage.format().encode_statistics(static_cast<int>(piece.segment), storage.numel(), piece.from, piece.to,
                                       statistics_.data() + statistics_at_[piece.weight], storage.scalars, piece.out);
  }
  // A weight's waiting pieces together (HQQ's codes and zero points share one solver run), each
  // weight's values let go of once it is encoded.
  for (size_t k = 0; k < unit_.frozen.size(); ++k) {
    std::vector<FrozenFormat::ScalarsPiece> pieces;
    for (const WaitingPiece& waiting : waiting_) {
      const FrozenPiece& piece = frozen_[waiting.piece];
      if (piece.weight == k)
        pieces.push_back(
            {static_cast<int>(piece.segment), piece.from, piece.to, waiting.values, waiting.dtype, piece.out});
    }
    if (pieces.empty()) continue;
    const FrozenStorage& storage = unit_.frozen[k]->frozen;
    storage.format().encode_pieces_with_scalars(storage.numel(), pieces, storage.scalars);
    for (WaitingPiece& waiting : waiting_)
      if (frozen_[waiting.piece].weight == k) waiting.read.reset();  // a piece sharing its values is of this weight
  }
  waiting_.clear();
}

void build_whole_unit(ParamUnit& unit, const UnitReader& reader, DType activation) {
  std::vector<FrozenPiece> frozen;
  for (size_t k = 0; k < unit.frozen.size(); ++k) {
    FrozenStorage& storage = unit.frozen[k]->frozen;
    storage.allocate(Device::CPU);
    for (size_t i = 0; i < storage.segments().size(); ++i)
      if (storage.segments()[i].bytes > 0) frozen.push_back({k, i, 0, storage.segments()[i].bytes, storage.segment(i).data()});
  }
  std::vector<MasterPiece> masters;
  for (size_t k = 0; k < unit.trainable.size(); ++k) {
    TrainableTensor& t = *unit.trainable[k];
    t.master = Tensor::empty(t.shape, DType::F32);
    t.grad = Tensor::zeros(t.shape, DType::F32);
    masters.push_back({k, 0, t.shape.numel(), t.master.data<float>()});
  }
  UnitBuild build(unit, reader, std::move(frozen), masters);
  build.finish();  // every value was read: the statistics are complete
  // The compute copies only now, once the values read in the load dtype are freed: a trainable
  // embedding is then never held three times over.
  for (TrainableTensor* t : unit.trainable) {
    if (activation != DType::F32) t->compute = Tensor::empty(t->shape, activation);
    t->refresh_compute();
  }
}

}  // namespace fsdpq
