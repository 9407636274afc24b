#include "quant/frozen_format.h"

#include <fmt/format.h>

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

void FrozenFormat::for_each_row(const MatrixView& out, int64_t unit, const char* units,
                                const std::function<void(int64_t first, int64_t count, void* row)>& fn) const {
  const int64_t cols = out.cols(), per_row = cols / unit;
  if (cols % unit != 0)
    throw std::logic_error(fmt::format("{}: rows of {} values are not whole {} of {}: cannot dequantise into columns "
                                       "of {}",
                                       name(), cols, units, unit, out.tensor.describe()));
  const size_t row_bytes = static_cast<size_t>(out.row_stride()) * dtype_size(out.dtype());
  for (int64_t r = 0; r < out.rows(); ++r)
    fn(r * per_row, per_row, static_cast<char*>(out.data()) + static_cast<size_t>(r) * row_bytes);
}

size_t stored_bytes(const FrozenFormat& format, int64_t numel) {
  size_t bytes = 0;
  for (const SegmentSpec& s : format.segments(numel)) bytes += s.bytes;
  return bytes;
}

}  // namespace fsdpq
