#include "quant/frozen_format.h"

#include <stdexcept>

namespace fsdpq {

int64_t element_count(const ElementRanges& ranges) {
  int64_t n = 0;
  for (const ElementRange& r : ranges) n += r.count;
  return n;
}

bool FrozenFormat::stores_values_as_read(int, size_t, size_t, DType) const { return false; }

// A format without statistics (dense values) has no step 2.
int64_t FrozenFormat::statistics_count(int64_t) const { return 0; }

FrozenScalars FrozenFormat::scalars_from(const float*, int64_t) const { return {}; }

void FrozenFormat::encode_statistics(int segment, int64_t, size_t, size_t, const float*, const FrozenScalars&,
                                     uint8_t*) const {
  throw std::logic_error(name() + ": segment " + std::to_string(segment) + " is not encoded from statistics");
}

// Only a format with needs_scalars segments (HQQ) has these.
void FrozenFormat::measure_values(int segment, int64_t, size_t, size_t, const void*, DType, float*) const {
  throw std::logic_error(name() + ": segment " + std::to_string(segment) + " does not need the scalars");
}

void FrozenFormat::encode_values_with_scalars(int segment, int64_t, size_t, size_t, const void*, DType,
                                              const FrozenScalars&, uint8_t*) const {
  throw std::logic_error(name() + ": segment " + std::to_string(segment) + " does not need the scalars");
}

void FrozenFormat::encode_pieces_with_scalars(int64_t numel, std::span<const ScalarsPiece> pieces,
                                              const FrozenScalars& scalars) const {
  for (const ScalarsPiece& p : pieces)
    encode_values_with_scalars(p.segment, numel, p.from, p.to, p.values, p.dtype, scalars, p.out);
}

size_t stored_bytes(const FrozenFormat& format, int64_t numel) {
  size_t bytes = 0;
  for (const SegmentSpec& s : format.segments(numel)) bytes += s.bytes;
  return bytes;
}

}  // namespace fsdpq
