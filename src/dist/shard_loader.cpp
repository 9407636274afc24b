#include "dist/shard_loader.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "dist/frozen_layout.h"
#include "model/llama_weights.h"
#include "quant/nf4.h"
#include "runtime/agreed_errors.h"
#include "runtime/fault_injection.h"

namespace fsdpq {
namespace {

size_t ceil_div(size_t n, size_t d) { return (n + d - 1) / d; }

// Bytes [from, to) of a dense weight's values: the elements covering them, read and cut.
void read_dense(const UnitReader& reader, const BaseWeight& w, DType dtype, size_t from, size_t to, uint8_t* out) {
  const size_t element = dtype_size(dtype);
  const size_t first = from / element, last = ceil_div(to, element);
  std::vector<uint8_t> values((last - first) * element);
  reader.read_frozen(w, static_cast<int64_t>(first), static_cast<int64_t>(last - first), values.data());
  std::memcpy(out, values.data() + (from - first * element), to - from);
}

// Bytes [from, to) of an NF4 weight's packed codes: the blocks holding them are read and
// quantised, their absmax stored at absmax[block].
void quantize_packed(const UnitReader& reader, const BaseWeight& w, DType dtype, size_t from, size_t to, uint8_t* out,
                     float* absmax) {
  const int64_t numel = w.nf4->numel;
  const int64_t first_block = static_cast<int64_t>(2 * from) / kNf4BlockSize;
  const int64_t end_block = nf4_num_blocks(std::min<int64_t>(static_cast<int64_t>(2 * to), numel));
  const int64_t first = first_block * kNf4BlockSize;
  const int64_t count = std::min(end_block * kNf4BlockSize, numel) - first;
  const int64_t blocks = end_block - first_block;
  std::vector<uint8_t> packed(static_cast<size_t>(nf4_packed_bytes(count)));
  if (dtype == DType::BF16) {
    std::vector<uint16_t> values(static_cast<size_t>(count));
    reader.read_frozen(w, first, count, values.data());
    nf4_quantize_blocks(values.data(), numel, first_block, blocks, packed.data(), absmax + first_block);
  } else if (dtype == DType::F32) {
    std::vector<float> values(static_cast<size_t>(count));
    reader.read_frozen(w, first, count, values.data());
    nf4_quantize_blocks(values.data(), numel, first_block, blocks, packed.data(), absmax + first_block);
  } else {
    throw std::logic_error(fmt::format("shard loader: '{}' is quantised from {}, expected BF16 or F32", w.name,
                                       dtype_name(dtype)));
  }
  const size_t base = static_cast<size_t>(first_block * kNf4BlockSize / 2);
  std::memcpy(out, packed.data() + (from - base), to - from);
}

void load_unit_shard(const World& world, FsdpEngine& engine, int unit, ParamUnit& skeleton, const UnitReader& reader) {
  Communicator& group = *engine.groups().shard;
  const int shard_rank = group.rank();
  std::vector<FrozenWeightShape> shapes;
  std::vector<DType> dtypes;
  for (const BaseWeight* w : skeleton.frozen) {
    dtypes.push_back(reader.frozen_dtype(*w));
    shapes.push_back(frozen_weight_shape(*w, dtypes.back()));
  }
  std::vector<int64_t> trainable_numel;
  for (const TrainableTensor* t : skeleton.trainable) trainable_numel.push_back(t->shape.numel());
  const UnitLayout layout = unit_layout(shapes, trainable_numel, group.size());

  // Every NF4 weight's absmax, concatenated; -inf where this rank did not compute it (max-reduced).
  std::vector<int64_t> absmax_at(shapes.size(), 0);
  int64_t absmax_count = 0;
  for (size_t k = 0; k < shapes.size(); ++k)
    if (shapes[k].nf4) {
      absmax_at[k] = absmax_count;
      absmax_count += nf4_num_blocks(shapes[k].numel);
    }
  std::vector<float> absmax(static_cast<size_t>(absmax_count), -std::numeric_limits<float>::infinity());

  std::vector<uint8_t> frozen(layout.frozen_shard_bytes, 0);
  std::vector<float> master(static_cast<size_t>(layout.shard_numel), 0.0f);
  const size_t begin = layout.frozen_begin(shard_rank), end = begin + layout.frozen_shard_bytes;
  auto owned = [&](const FrozenSegment& seg, size_t& lo, size_t& hi) {
    lo = std::max(begin, seg.offset);
    hi = std::min(end, seg.offset + seg.bytes);
    return lo < hi;
  };

  // What this rank reads. Agreed before the collective below, so that a rank failing here (a
  // short file, a bad tensor) ends every rank with its message instead of leaving them waiting.
  run_on_all_ranks(world, [&] {
    maybe_inject_fault(world, fmt::format("load_unit_{}", unit));
    for (const FrozenSegment& seg : layout.segments) {
      size_t lo, hi;
      if (!owned(seg, lo, hi)) continue;
      const BaseWeight& w = *skeleton.frozen[seg.weight];
      uint8_t* out = frozen.data() + (lo - begin);
      if (seg.kind == SegmentKind::Dense)
        read_dense(reader, w, dtypes[seg.weight], lo - seg.offset, hi - seg.offset, out);
      else if (seg.kind == SegmentKind::Nf4Packed)
        quantize_packed(reader, w, dtypes[seg.weight], lo - seg.offset, hi - seg.offset, out,
                        absmax.data() + absmax_at[seg.weight]);
    }
    const int64_t tbegin = layout.trainable_begin(shard_rank), tend = tbegin + layout.shard_numel;
    for (size_t k = 0; k < skeleton.trainable.size(); ++k) {
      const int64_t offset = layout.trainable_offset[k];
      const int64_t lo = std::max(tbegin, offset), hi = std::min(tend, offset + trainable_numel[k]);
      if (lo < hi) reader.read_master(*skeleton.trainable[k], lo - offset, hi - lo, master.data() + (lo - tbegin));
    }
  });

  // Each block's absmax came from the rank(s) holding its codes; now every rank has all of them.
  if (absmax_count > 0)
    group.all_reduce(absmax.data(), static_cast<size_t>(absmax_count), CommType::F32, ReduceOp::Max).wait();

  run_on_all_ranks(world, [&] {
    for (size_t k = 0; k < shapes.size(); ++k) {
      if (!shapes[k].nf4) continue;
      Nf4Tensor& nf4 = *skeleton.frozen[k]->nf4;
      const float* a = absmax.data() + absmax_at[k];
      const int64_t blocks = nf4_num_blocks(shapes[k].numel);
      if (std::any_of(a, a + blocks, [](float v) { return v == -std::numeric_limits<float>::infinity(); }))
        throw std::logic_error(fmt::format("shard loader: a block of '{}' was quantised by no rank", skeleton.frozen[k]->name));
      // The whole tensor's double quantisation, as nf4_quantize does it (1/64 of the values: cheap).
      std::vector<uint8_t> absmax_q;
      std::vector<float> scale;
      if (nf4.double_quant) {
        nf4.absmax_offset = nf4_absmax_offset(nf4_absmax_partial_sum(a, blocks), blocks);
        absmax_q.resize(static_cast<size_t>(blocks));
        scale.resize(ceil_div(static_cast<size_t>(blocks), static_cast<size_t>(kNf4AbsmaxBlockSize)));
        nf4_double_quantize_absmax(a, blocks, 0, blocks, nf4.absmax_offset, absmax_q.data(), scale.data());
      }
      for (const FrozenSegment& seg : layout.segments) {
        size_t lo, hi;
        if (seg.weight != k || !owned(seg, lo, hi)) continue;
        const uint8_t* src = nullptr;
        if (seg.kind == SegmentKind::Nf4Absmax) src = reinterpret_cast<const uint8_t*>(a);
        if (seg.kind == SegmentKind::Nf4AbsmaxQ) src = absmax_q.data();
        if (seg.kind == SegmentKind::Nf4AbsmaxScale) src = reinterpret_cast<const uint8_t*>(scale.data());
        if (src) std::memcpy(frozen.data() + (lo - begin), src + (lo - seg.offset), hi - lo);
      }
    }
    engine.adopt_unit_shard(unit, skeleton, layout, dtypes, std::move(frozen), std::move(master));
  });
}

}  // namespace

UnitLoader shard_loader(const World& world, FsdpEngine& engine) {
  return [&world, &engine](int unit, ParamUnit& skeleton, const UnitReader& reader) {
    load_unit_shard(world, engine, unit, skeleton, reader);
  };
}

}  // namespace fsdpq
