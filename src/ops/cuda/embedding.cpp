// The embedding ops on the GPU (kernels/embedding.cuh); ops/embedding.cpp checks their arguments
// and holds the CPU reference.
#include "kernels/embedding.cuh"
#include "ops/cuda/kernel_args.h"
#include "ops/cuda_ops.h"
#include "util/error.h"

namespace fsdpq::cuda_ops {
namespace {

// The CPU's id check for ids on the GPU: the kernel flags the first bad position, then the same UserError.
void check_ids_on_gpu(const TensorView& ids, int64_t vocab) {
  Tensor flag = Tensor::empty(Shape{1}, DType::I32, Device::CUDA);
  int32_t bad_id = 0;
  const int64_t n = cuda::embedding_first_bad_id(ids.as<const int32_t>(), ids.numel(), vocab, flag.data<int32_t>(),
                                                 &bad_id, cuda::stream());
  if (n >= 0)
    fail("token id {} at position {} is outside the vocabulary of {} tokens (valid ids are 0..{})", bad_id, n, vocab,
         vocab - 1);
}

}  // namespace

void embedding_forward(TensorView out, const TensorView& ids, const TensorView& table) {
  constexpr const char* op = "embedding_forward";
  check_ids_on_gpu(ids, table.shape[0]);
  cuda::embedding_forward(out.data, ktype(op, out), ids.as<const int32_t>(), table.data, ktype(op, table), ids.numel(),
                          table.shape[1], cuda::stream());
}

void embedding_backward(TensorView dtable, const TensorView& ids, const TensorView& dout) {
  constexpr const char* op = "embedding_backward";
  check_ids_on_gpu(ids, dtable.shape[0]);
  cuda::embedding_backward(dtable.as<float>(), ids.as<const int32_t>(), dout.data, ktype(op, dout), ids.numel(),
                           dtable.shape[1], cuda::stream());
}

}  // namespace fsdpq::cuda_ops
