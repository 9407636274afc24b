// Building a unit's weights from a UnitReader (model/llama_weights.h): the one path every weight
// of the model is built by. A rank of a shard group builds the pieces of the unit that fall in
// its shard, into its flat shard bytes (fsdp/shard_loader.cpp); the whole model is the same
// build with a shard group of one: every piece whole, into the weights' own storage
// (build_whole_unit).
//
// The build has the two steps of a frozen format's encoding (quant/frozen_format.h): the
// constructor reads the values under the pieces and encodes what values alone decide; finish()
// encodes what needs a whole tensor's statistics (and the value pieces whose bytes need the
// tensor's scalars: HQQ's codes and zero points, whose values it keeps until then). Between them
// a shard group completes the statistics (a max all-reduce); a whole build has them all already.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "model/llama_weights.h"

namespace fsdpq {

// Bytes [from, to) of segment `segment` of the unit's frozen weight `weight`, to be built at `out`.
struct FrozenPiece {
  size_t weight = 0, segment = 0;
  size_t from = 0, to = 0;
  uint8_t* out = nullptr;
};

// Elements [first, first + count) of the fp32 master of the unit's trainable tensor `tensor`, at `out`.
struct MasterPiece {
  size_t tensor = 0;
  int64_t first = 0, count = 0;
  float* out = nullptr;
};

class UnitBuild {
 public:
  // Reads what the pieces need and builds the masters' pieces and the frozen pieces of value
  // segments, keeping the statistics of the values read.
  UnitBuild(const ParamUnit& unit, const UnitReader& reader, std::vector<FrozenPiece> frozen,
            const std::vector<MasterPiece>& masters);
  // The unit's frozen weights' statistics, concatenated in unit order, kUnknownStatistic where
  // this build read no values: a shard group max-reduces them before finish().
  std::span<float> statistics() { return statistics_; }
  // Sets every frozen weight's scalars and builds the pieces of statistics segments. Throws
  // std::logic_error if some statistic is still unknown (a value no rank read).
  void finish();

 private:
  const ParamUnit& unit_;
  std::vector<FrozenPiece> frozen_;
  std::vector<size_t> statistics_at_;  // per frozen weight, where its statistics start
  std::vector<float> statistics_;
  // A needs_scalars piece measured by the constructor, with its values, for finish() to encode.
  struct WaitingPiece {
    size_t piece;  // in frozen_
    DType dtype;
    ElementRanges ranges;  // the weight's elements `values` holds, concatenated
    std::unique_ptr<uint8_t[]> read;  // the values where this piece read them (null where it shares another's)
    const uint8_t* values;            // in `read`, or in another waiting piece's of the same weight
  };
  std::vector<WaitingPiece> waiting_;
  // Where a waiting piece of the weight already holds the values of `ranges` (one range, inside one
  // of the piece's): HQQ's zero points want the groups its codes read, so a whole build reads and
  // keeps each weight once. nullptr where none does.
  const uint8_t* held_values(size_t weight, DType dtype, const ElementRanges& ranges) const;
};

// Builds the whole unit into its own tensors in host memory: each frozen weight's segments
// allocated and encoded, each trainable tensor's master read, its gradient zeroed and its
// compute copy (in `activation`, unless that is F32) rounded from the master.
void build_whole_unit(ParamUnit& unit, const UnitReader& reader, DType activation);

// Where the builds of this process spent their time so far (wall time, every thread's calls
// summed): reading the frozen weights' values (from the model files, or drawing a preset's) and
// encoding them into their stored format (quantising: for HQQ the solver's time is part of it,
// quant/hqq_solve.h counts that alone). The trainer logs it beside "model ready".
struct UnitBuildTimes {
  double read_seconds = 0.0;
  double encode_seconds = 0.0;
};
UnitBuildTimes unit_build_times();

}  // namespace fsdpq
