#include "util/shape_text.h"

#include <fmt/format.h>

#include "util/strings.h"

namespace fsdpq {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::vector<std::string> dims;
  for (int64_t d : shape) dims.push_back(std::to_string(d));
  return fmt::format("[{}]", join(dims, ", "));
}

std::optional<int64_t> checked_numel(const std::vector<int64_t>& shape) {
  constexpr int64_t kLimit = int64_t{1} << 62;
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d != 0 && n > kLimit / d) return std::nullopt;
    n *= d;
  }
  return n;
}

}  // namespace fsdpq
