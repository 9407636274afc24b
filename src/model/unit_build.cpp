#include "model/unit_build.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace fsdpq {

UnitBuild::UnitBuild(const ParamUnit& unit, const UnitReader& reader, std::vector<FrozenPiece> frozen,
                     const std::vector<MasterPiece>& masters)
    : unit_(unit), frozen_(std::move(frozen)) {
  size_t count = 0;
  for (const BaseWeight* w : unit.frozen) {
    statistics_at_.push_back(count);
    count += static_cast<size_t>(w->frozen.format().statistics_count(w->frozen.numel()));
  }
  statistics_.assign(count, kUnknownStatistic);

  std::vector<uint8_t> values;
  for (const FrozenPiece& piece : frozen_) {
    const BaseWeight& w = *unit.frozen.at(piece.weight);
    const FrozenFormat& format = w.frozen.format();
    if (w.frozen.segments().at(piece.segment).from_statistics) continue;  // finish()
    const DType dtype = reader.frozen_dtype(w);
    if (!format.accepts_values(dtype))
      throw std::logic_error(fmt::format("UnitBuild: '{}' is stored as {} but its values come as {}", w.name,
                                         format.name(), dtype_name(dtype)));
    const ElementRange range = format.values_for(static_cast<int>(piece.segment), w.frozen.numel(), piece.from, piece.to);
    if (format.stores_values_as_read(static_cast<int>(piece.segment), piece.from, piece.to, dtype)) {
      reader.read_frozen(w, range.first, range.count, piece.out);
      continue;
    }
    values.resize(static_cast<size_t>(range.count) * dtype_size(dtype));
    reader.read_frozen(w, range.first, range.count, values.data());
    format.encode_values(static_cast<int>(piece.segment), w.frozen.numel(), piece.from, piece.to, values.data(), dtype,
                         piece.out, statistics_.data() + statistics_at_[piece.weight]);
  }
  for (const MasterPiece& piece : masters)
    reader.read_master(*unit.trainable.at(piece.tensor), piece.first, piece.count, piece.out);
}

void UnitBuild::finish() {
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
