// The start-up check of fsdpq's environment variables (runtime/environment.h): accepted values
// pass, unset and empty mean the default, anything else is an error naming the variable.
#include "runtime/environment.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "test_support.h"

namespace fsdpq {
namespace {

void check(const std::map<std::string, std::string>& env) {
  check_environment([&](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(Environment, AcceptedValuesUnsetAndEmptyPass) {
  EXPECT_NO_THROW(check({}));
  EXPECT_NO_THROW(check({{"FSDPQ_SHARE_GPUS", "1"}, {"FSDPQ_COLLECTIVES", "mpi"}, {"FSDPQ_ATTENTION", "simt"},
                         {"FSDPQ_SECTION_TIMES", "0"}}));
  EXPECT_NO_THROW(check({{"FSDPQ_COLLECTIVES", ""}, {"FSDPQ_ROOT", "/anything"}}));  // others are not ours to judge
  for (const EnvironmentKnob& knob : environment_knobs())
    for (const std::string& value : knob.values) EXPECT_NO_THROW(check({{knob.name, value}})) << knob.name;
}

TEST(Environment, AnythingElseNamesTheVariable) {
  EXPECT_EQ(test::error_of([] { check({{"FSDPQ_SECTION_TIMES", "yes"}}); }),
            "environment: FSDPQ_SECTION_TIMES = 'yes' is not a value it takes (expected 0 or 1; log the compute "
            "stream's time per section of the pass); unset it for the default");
  EXPECT_EQ(test::error_of([] { check({{"FSDPQ_ATTENTION", "flash"}}); }),
            "environment: FSDPQ_ATTENTION = 'flash' is not a value it takes (expected auto or mma or simt or "
            "cudnn or cudnn-nondeterministic or wgmma; the GPU attention kernels); unset it for the default");
  EXPECT_NE(test::error_of([] { check({{"FSDPQ_SHARE_GPUS", "true"}}); }).find("FSDPQ_SHARE_GPUS = 'true'"),
            std::string::npos);
  EXPECT_NE(test::error_of([] { check({{"FSDPQ_COLLECTIVES", "gloo"}}); }).find("expected nccl or mpi"),
            std::string::npos);
}

}  // namespace
}  // namespace fsdpq
