// A test suite around one tiny random model that fsdpq's init-model wrote (the generate and merge
// command tests): each suite that derives from TinyModelSuite<Suite> has its own folder and model.
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "model/llama_config.h"
#include "test_support.h"

namespace fsdpq::test {

template <class Suite>
class TinyModelSuite : public ::testing::Test {
 protected:
  // A fresh folder (tagged `tag`) holding dir_/model: the tiny preset with vocab 300 and `seed`.
  static void make_tiny_model(const std::string& tag, int seed) {
    dir_ = make_temp_dir(tag);
    auto r = run_fsdpq("init-model --preset tiny --vocab_size 300 --seed " + std::to_string(seed) + " --out " +
                       quoted(dir_ / "model"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    config_ = load_llama_config(dir_ / "model" / "config.json");
  }

  static inline std::filesystem::path dir_;
  static inline LlamaConfig config_;
};

}  // namespace fsdpq::test
