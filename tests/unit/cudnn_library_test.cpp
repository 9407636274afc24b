// cuDNN's run-time loading (backend/cudnn_library.h) and the attention route's memory rule
// (backend/cudnn_sdpa.h), the parts that need no GPU: opening libcudnn and reading its version
// touch no device, so they run here wherever a cuDNN 9 is installed.
#include "backend/cudnn_library.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "backend/cudnn_sdpa.h"

namespace fsdpq {
namespace {

TEST(CudnnLibrary, VersionText) {
  EXPECT_EQ(cudnn::version_text(91900), "9.19.0");
  EXPECT_EQ(cudnn::version_text(90102), "9.1.2");
}

#ifdef FSDPQ_WITH_CUDA
TEST(CudnnLibrary, AMissingLibrarySaysWhatWasTriedAndWhatToDo) {
  const cudnn::OpenedLibrary opened = cudnn::open_cudnn({"libfsdpq-no-such-cudnn.so.9"});
  EXPECT_EQ(opened.dl_handle, nullptr);
  EXPECT_NE(opened.why_not.find("libfsdpq-no-such-cudnn.so.9"), std::string::npos) << opened.why_not;
  EXPECT_NE(opened.why_not.find("LD_LIBRARY_PATH"), std::string::npos) << opened.why_not;
}

// The CUDA toolkit of the build machine carries cuDNN 9 (docs/cuda.md); where it does, it opens at
// run time with its version, and a library that is not cuDNN is passed over for the next candidate.
TEST(CudnnLibrary, OpensTheToolkitsCudnnAtRunTime) {
  const std::string path = "/usr/local/cuda/lib64/libcudnn.so.9";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no " << path << " on this machine";
  const cudnn::OpenedLibrary opened = cudnn::open_cudnn({"libfsdpq-no-such-cudnn.so.9", path});
  ASSERT_NE(opened.dl_handle, nullptr) << opened.why_not;
  EXPECT_EQ(opened.path, path);
  EXPECT_GE(opened.version, cudnn::kMinimumVersion);
  EXPECT_LT(opened.version, 100000u);
}
#endif

// The rule's point: at a long sequence a [T, T] bf16 matrix per head cannot fit in the workspace
// fsdpq allows, while what cuDNN's linear backward needs (an fp32 dQ accumulator and a row sum) does.
TEST(CudnnSdpa, BackwardWorkspaceLimitIsLinearInT) {
  const cudnn::SdpaShape s{1, 4096, 32, 8, 128, cudnn::SdpaType::BF16};
  const int64_t limit = cudnn::sdpa_backward_workspace_limit(s);
  const int64_t score_matrices = s.B * s.H * s.T * s.T * 2;
  const int64_t dq_accumulator = s.B * s.H * s.T * (s.D + 1) * 4;
  EXPECT_LT(limit, score_matrices);
  EXPECT_GE(limit, dq_accumulator);
  cudnn::SdpaShape doubled = s;
  doubled.T *= 2;
  const int64_t constant = int64_t{64} << 20;
  EXPECT_EQ(cudnn::sdpa_backward_workspace_limit(doubled) - constant, 2 * (limit - constant));
}

}  // namespace
}  // namespace fsdpq
