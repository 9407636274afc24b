// Typed element access for the CPU ops. An op picks the storage types of its tensors once
// (with_storage) and runs a loop instantiated for them, so no loop switches on dtype per element.
// Storage is float (F32), bf16_bits (BF16) or f16_bits (F16, fp16_autocast); math is always fp32
// and stores round to nearest even.
#pragma once
#include "backend/tensor.h"
#include "util/bf16.h"

#include <fmt/format.h>

#include <cstddef>
#include <stdexcept>
#include <type_traits>

namespace fsdpq {

// IEEE half storage. A distinct type (bf16_bits is a plain uint16_t) so overloads tell them apart.
struct f16_bits {
  uint16_t bits;
};
static_assert(sizeof(f16_bits) == 2);

inline float to_f32(float value) { return value; }
inline float to_f32(bf16_bits value) { return bf16_to_float(value); }
inline float to_f32(f16_bits value) { return f16_to_float(value.bits); }

template <class Storage>
inline Storage from_f32(float value) {
  if constexpr (std::is_same_v<Storage, float>)
    return value;
  else if constexpr (std::is_same_v<Storage, f16_bits>)
    return f16_bits{float_to_f16(value)};
  else
    return float_to_bf16(value);
}

// The value a float becomes once stored as Storage and read back.
template <class Storage>
inline float round_to(float value) {
  return to_f32(from_f32<Storage>(value));
}

// Calls fn(Storage{}) with the storage type of dtype: float for F32, bf16_bits for BF16, f16_bits
// for F16.
template <class Fn>
decltype(auto) with_storage(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::F32: return fn(float{});
    case DType::BF16: return fn(bf16_bits{});
    case DType::F16: return fn(f16_bits{});
    default: break;
  }
  throw std::logic_error(fmt::format("{}: unsupported dtype {} (the CPU ops take F32, BF16 or F16)", op, dtype_name(dtype)));
}

namespace storage_detail {
template <size_t I, size_t N, class Fn, class... Tags>
decltype(auto) with_storages_from(const DType (&dtypes)[N], const char* op, Fn& fn, Tags... tags) {
  if constexpr (I == N)
    return fn(tags...);
  else
    return with_storage(dtypes[I], op, [&](auto tag) -> decltype(auto) {
      return with_storages_from<I + 1>(dtypes, op, fn, tags..., tag);
    });
}
}  // namespace storage_detail

// with_storage for several tensors at once: fn(Storage1{}, Storage2{}, ...) with the storage type
// of each of `dtypes`, in order (the first unsupported one throws), so that an op whose operands
// may each be F32, BF16 or F16 gets one loop per combination without nesting a dispatch per operand.
template <size_t N, class Fn>
decltype(auto) with_storages(const DType (&dtypes)[N], const char* op, Fn&& fn) {
  return storage_detail::with_storages_from<0>(dtypes, op, fn);
}

}  // namespace fsdpq
