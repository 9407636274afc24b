#include "fsdp/shard_loader.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "fsdp/frozen_layout.h"
#include "model/llama_weights.h"
#include "model/unit_build.h"
#include "runtime/agreed_errors.h"
#include "runtime/fault_injection.h"

namespace fsdpq {
namespace {

void load_unit_shard(const World& world, Fsdp& fsdp, int unit, ParamUnit& skeleton, const UnitReader& reader) {
  Communicator& group = *fsdp.groups().shard;
  const int shard_rank = group.rank();
  const UnitLayout layout = unit_layout(skeleton, group.size());
  std::vector<uint8_t> frozen(layout.frozen_shard_bytes, 0);
  std::vector<float> master(static_cast<size_t>(layout.shard_numel), 0.0f);

  // The pieces of the unit in this rank's shard, where they go in it.
  std::vector<FrozenPiece> frozen_pieces;
  const size_t begin = layout.frozen_begin(shard_rank), end = begin + layout.frozen_shard_bytes;
  for (const FrozenSegment& seg : layout.segments) {
    const size_t lo = std::max(begin, seg.offset), hi = std::min(end, seg.offset + seg.bytes);
    if (lo < hi) frozen_pieces.push_back({seg.weight, seg.segment, lo - seg.offset, hi - seg.offset, frozen.data() + (lo - begin)});
  }
  std::vector<MasterPiece> master_pieces;
  const int64_t tbegin = layout.trainable_begin(shard_rank), tend = tbegin + layout.shard_numel;
  for (size_t k = 0; k < skeleton.trainable.size(); ++k) {
    const int64_t offset = layout.trainable_offset[k];
    const int64_t lo = std::max(tbegin, offset), hi = std::min(tend, offset + skeleton.trainable[k]->shape.numel());
    if (lo < hi) master_pieces.push_back({k, lo - offset, hi - lo, master.data() + (lo - tbegin)});
  }

  // What this rank reads. Agreed before the collective below, so that a rank failing here (a
  // short file, a bad tensor) ends every rank with its message instead of leaving them waiting.
  std::optional<UnitBuild> build;
  run_on_all_ranks(world, [&] {
    maybe_inject_fault(world, fmt::format("load_unit_{}", unit));
    build.emplace(skeleton, reader, std::move(frozen_pieces), master_pieces);
  });

  // Each statistic came from the rank(s) that read its values; now every rank has all of them.
  const std::span<float> statistics = build->statistics();
  if (!statistics.empty())
    group.all_reduce(statistics.data(), statistics.size(), CommType::F32, ReduceOp::Max).wait();

  run_on_all_ranks(world, [&] {
    build->finish();
    fsdp.adopt_unit(unit, skeleton, layout, std::move(frozen), std::move(master));
  });
}

}  // namespace

UnitLoader shard_loader(const World& world, Fsdp& fsdp) {
  return [&world, &fsdp](int unit, ParamUnit& skeleton, const UnitReader& reader) {
    load_unit_shard(world, fsdp, unit, skeleton, reader);
  };
}

}  // namespace fsdpq
