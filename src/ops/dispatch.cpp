#include "ops/dispatch.h"

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace fsdpq {

bool runs_on_cuda(const char* op, std::initializer_list<TensorView> operands) {
  int cuda = 0, cpu = 0;
  for (const TensorView& view : operands)
    if (view.data != nullptr) (view.device == Device::CUDA ? cuda : cpu)++;
  if (cuda > 0 && cpu > 0) {
    std::string where;  // built only on failure: this runs on every op call
    for (const TensorView& view : operands)
      if (view.data != nullptr) where += (where.empty() ? "" : ", ") + view.describe();
    throw std::logic_error(fmt::format("{}: operands on different devices ({})", op, where));
  }
  if (!kWithCuda && cuda > 0)
    throw std::logic_error(fmt::format("{}: CUDA operands, but this fsdpq was built without CUDA", op));
  return cuda > 0;
}

}  // namespace fsdpq
