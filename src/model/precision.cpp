#include "model/precision.h"

#include <fmt/format.h>

#include <utility>
#include <vector>

#include "util/error.h"
#include "util/strings.h"

namespace fsdpq {

Precision parse_precision(const std::string& name) {
  static const std::vector<std::pair<std::string, Precision>> known = {
      {"fp32", Precision::FP32},
      {"bf16", Precision::BF16},
      {"fp16_autocast", Precision::FP16Autocast},
      {"bf16_autocast", Precision::BF16Autocast},
      {"bf16_buffers_autocast", Precision::BF16BuffersAutocast}};
  std::vector<std::string> names;
  for (const auto& [n, p] : known) {
    if (n == name) return p;
    names.push_back(n);
  }
  const std::string guess = closest_match(name, names);
  fail("precision '{}' is not supported{}; allowed: {}", name, guess.empty() ? "" : fmt::format(" (did you mean '{}'?)", guess),
       join(names, ", "));
}

DType activation_grad_dtype(DType activation) { return activation == DType::BF16 ? DType::BF16 : DType::F32; }

DType activation_dtype(Precision precision) {
  switch (precision) {
    case Precision::FP32: return DType::F32;
    case Precision::FP16Autocast: return DType::F16;
    default: return DType::BF16;
  }
}

}  // namespace fsdpq
