// Shapes as files store them (a list of dimensions): printing them and counting their elements
// safely, for the readers of safetensors and checkpoint files, which must not trust a header.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fsdpq {

std::string shape_text(const std::vector<int64_t>& shape);  // "[2, 3]"

// The element count, or nullopt when a dimension is negative or the product would not fit
// comfortably in 63 bits (such a shape can only come from a corrupt file or a bug).
std::optional<int64_t> checked_numel(const std::vector<int64_t>& shape);

}  // namespace fsdpq
