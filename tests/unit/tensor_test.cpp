#include "backend/tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "backend/host_tensor_bytes.h"

namespace fsdpq {

TEST(TensorShape, SizesAndPrinting) {
  Shape s{2, 3, 4};
  EXPECT_EQ(s.rank, 3);
  EXPECT_EQ(s.numel(), 24);
  EXPECT_EQ(s.rows(), 6);
  EXPECT_EQ(s.last(), 4);
  EXPECT_EQ(s.to_string(), "[2, 3, 4]");
  EXPECT_EQ(Shape{}.numel(), 1);  // a scalar
  EXPECT_EQ(Shape{}.to_string(), "[]");
  EXPECT_EQ((Shape{5, 0}).numel(), 0);
}

TEST(TensorShape, EqualityComparesRankAndDims) {
  EXPECT_EQ((Shape{2, 3}), (Shape{2, 3}));
  EXPECT_NE((Shape{2, 3}), (Shape{3, 2}));
  EXPECT_NE((Shape{6}), (Shape{6, 1}));
}

TEST(TensorShape, RejectsRankAboveFourAndNegativeDims) {
  EXPECT_THROW((Shape{1, 2, 3, 4, 5}), std::logic_error);
  EXPECT_THROW((Shape{2, -1}), std::logic_error);
}

TEST(Tensor, CpuStorageIs64ByteAligned) {
  for (int64_t n : {1, 3, 17, 1000, 4097}) {
    for (DType dtype : {DType::F32, DType::BF16, DType::I32}) {
      Tensor t = Tensor::empty(Shape{n}, dtype);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(t.view().data) % 64, 0u) << n;
      EXPECT_EQ(t.nbytes(), static_cast<size_t>(n) * dtype_size(dtype));
    }
  }
  Tensor empty = Tensor::empty(Shape{0, 8}, DType::F32);
  EXPECT_TRUE(empty.defined());
  EXPECT_EQ(empty.numel(), 0);
}

// A borrowed tensor views another's memory and never frees it: the owner's bytes stay live (and
// counted once) through the borrower's moves and destruction, and writes land in the owner.
TEST(Tensor, BorrowedMemoryStaysTheOwners) {
  Tensor owner = Tensor::zeros(Shape{4, 8}, DType::F32);
  const int64_t live = host_tensor_bytes().live;
  {
    Tensor block = Tensor::borrow(owner.view().slice_rows(1, 2).reshaped(Shape{16}));
    EXPECT_EQ(host_tensor_bytes().live, live);
    EXPECT_EQ(block.shape(), Shape{16});
    block.data<float>()[0] = 3.0f;
    Tensor moved = std::move(block);
    EXPECT_FALSE(block.defined());
    moved.data<float>()[15] = 5.0f;
    Tensor assigned = Tensor::zeros(Shape{2}, DType::F32);
    assigned = std::move(moved);  // frees its own, not the borrowed
    EXPECT_EQ(assigned.data<float>()[0], 3.0f);
  }
  EXPECT_EQ(host_tensor_bytes().live, live);
  EXPECT_EQ(owner.data<float>()[8], 3.0f);
  EXPECT_EQ(owner.data<float>()[23], 5.0f);
  EXPECT_THROW(Tensor::borrow(TensorView{}), std::logic_error);
  // A borrower that is then given memory of its own frees that.
  Tensor reused = Tensor::borrow(owner.view());
  reused = Tensor::zeros(Shape{3}, DType::F32);
  EXPECT_EQ(host_tensor_bytes().live, live + 12);
}

TEST(Tensor, ZerosAreZero) {
  Tensor t = Tensor::zeros(Shape{3, 5, 7}, DType::BF16);
  const uint16_t* p = t.data<uint16_t>();
  for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(p[i], 0);
}

TEST(Tensor, MoveTransfersOwnership) {
  Tensor a = Tensor::zeros(Shape{4}, DType::F32);
  void* data = a.view().data;
  Tensor b = std::move(a);
  EXPECT_FALSE(a.defined());  // NOLINT(bugprone-use-after-move): moved-from state is specified
  EXPECT_EQ(b.view().data, data);
  Tensor c = Tensor::zeros(Shape{2}, DType::F32);
  c = std::move(b);
  EXPECT_EQ(c.view().data, data);
  EXPECT_EQ(c.shape(), (Shape{4}));
}

TEST(Tensor, CudaAllocationNeedsTheBackend) {
  try {
    Tensor t = Tensor::empty(Shape{4}, DType::F32, Device::CUDA);
    FAIL() << "expected std::logic_error";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("before the CUDA backend started (cuda_init)"), std::string::npos) << e.what();
  }
}

TEST(Tensor, TypedDataChecksTheElementSize) {
  Tensor t = Tensor::empty(Shape{4}, DType::BF16);
  EXPECT_NO_THROW(t.data<uint16_t>());
  EXPECT_THROW(t.data<float>(), std::logic_error);
}

TEST(Tensor, LoadStoreRoundBf16ToNearestEven) {
  Tensor t = Tensor::empty(Shape{4}, DType::BF16);
  TensorView v = t.view();
  // bf16 keeps 7 fraction bits: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 (odd): ties go to 1.
  store_f32(v, 0, 1.0f + std::ldexp(1.0f, -8));
  EXPECT_EQ(load_f32(v, 0), 1.0f);
  // 1 + 3·2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): goes to 1 + 2^-6.
  store_f32(v, 1, 1.0f + 3.0f * std::ldexp(1.0f, -8));
  EXPECT_EQ(load_f32(v, 1), 1.0f + std::ldexp(1.0f, -6));
  // Just above the tie rounds up.
  store_f32(v, 2, 1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20));
  EXPECT_EQ(load_f32(v, 2), 1.0f + std::ldexp(1.0f, -7));
  store_f32(v, 3, -2.5f);
  EXPECT_EQ(load_f32(v, 3), -2.5f);

  Tensor f = Tensor::empty(Shape{1}, DType::F32);
  TensorView fv = f.view();
  store_f32(fv, 0, 0.1f);
  EXPECT_EQ(load_f32(fv, 0), 0.1f);
  Tensor ints = Tensor::empty(Shape{1}, DType::I32);
  EXPECT_THROW(load_f32(ints.view(), 0), std::logic_error);
}

TEST(Tensor, ViewsReshapeAndSliceRows) {
  Tensor t = Tensor::zeros(Shape{4, 6}, DType::F32);
  float* p = t.data<float>();
  for (int i = 0; i < 24; ++i) p[i] = static_cast<float>(i);
  TensorView v = t.view().reshaped(Shape{2, 2, 6});
  EXPECT_EQ(v.shape, (Shape{2, 2, 6}));
  EXPECT_THROW(t.view().reshaped(Shape{5, 5}), std::logic_error);
  TensorView rows = t.view().slice_rows(1, 2);
  EXPECT_EQ(rows.shape, (Shape{2, 6}));
  EXPECT_EQ(load_f32(rows, 0), 6.0f);
  EXPECT_EQ(load_f32(rows, 11), 17.0f);
  EXPECT_THROW(t.view().slice_rows(3, 2), std::logic_error);
  EXPECT_EQ(t.view().describe(), "F32[4, 6] on CPU");
}

}  // namespace fsdpq
