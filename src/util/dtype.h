// Element types, named as safetensors names them (the on-disk format every model file uses).
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace fsdpq {

enum class DType : uint8_t { F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL, F8_E4M3, F8_E5M2 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::F64: case DType::I64: return 8;
    case DType::F32: case DType::I32: return 4;
    case DType::F16: case DType::BF16: case DType::I16: return 2;
    case DType::I8: case DType::U8: case DType::BOOL: case DType::F8_E4M3: case DType::F8_E5M2: return 1;
  }
  return 0;
}

// "F32", "BF16", ... exactly as in a safetensors header.
constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F64: return "F64";
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::I64: return "I64";
    case DType::I32: return "I32";
    case DType::I16: return "I16";
    case DType::I8: return "I8";
    case DType::U8: return "U8";
    case DType::BOOL: return "BOOL";
    case DType::F8_E4M3: return "F8_E4M3";
    case DType::F8_E5M2: return "F8_E5M2";
  }
  return "?";
}

inline std::optional<DType> dtype_from_name(std::string_view name) {
  for (DType t : {DType::F64, DType::F32, DType::F16, DType::BF16, DType::I64, DType::I32, DType::I16,
                  DType::I8, DType::U8, DType::BOOL, DType::F8_E4M3, DType::F8_E5M2})
    if (dtype_name(t) == name) return t;
  return std::nullopt;
}

}  // namespace fsdpq
