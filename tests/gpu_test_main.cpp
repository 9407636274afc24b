// main() for the GPU tests: without a usable GPU the whole binary is skipped, loudly, and ctest
// reports it as skipped (exit code 77, the SKIP_RETURN_CODE of these tests).
#include <cstdio>

#include "gpu_test_support.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  std::string why = fsdpq::test::why_no_gpu();
  if (!why.empty()) {
    std::fprintf(stderr,
                 "\n*** SKIPPED: the GPU tests need a CUDA device (%s). Run them on a GPU machine: "
                 "ctest -L gpu ***\n\n",
                 why.c_str());
    return 77;
  }
  return RUN_ALL_TESTS();
}
