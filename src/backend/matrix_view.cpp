#include "backend/matrix_view.h"

#include <fmt/format.h>

#include <stdexcept>

namespace fsdpq {

TensorView MatrixView::as_tensor() const {
  if (!whole())
    throw std::logic_error(fmt::format("MatrixView::as_tensor: columns [{}, {}) of {} are not a tensor of their own",
                                       first_column, first_column + cols(), tensor.describe()));
  return tensor;
}

}  // namespace fsdpq
