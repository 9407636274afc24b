// The fingerprint a checkpoint keeps of its frozen base (train/base_fingerprint.h): equal for the
// same weights and tokenizer wherever they live, different — and said how — for other ones.
#include "train/base_fingerprint.h"

#include <gtest/gtest.h>

#include "model/init_model.h"
#include "model/presets.h"
#include "test_support.h"

namespace fsdpq {
namespace {

namespace fs = std::filesystem;

ModelSource model_at(const fs::path& dir) { return open_model_source(dir.string()); }

ModelSource preset(const std::string& name) {
  ModelSource m;
  m.config = preset_or_fail(name);
  m.name = "preset:" + name;
  m.preset = name;
  return m;
}

// The byte tokenizer with another end-of-sequence id: the same vocabulary, another behaviour.
class EosIsUnk final : public data::Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text) const override { return bytes_.encode(text); }
  std::string decode(const std::vector<int32_t>& ids) const override { return bytes_.decode(ids); }
  std::string piece(int32_t id) const override { return bytes_.piece(id); }
  int32_t bos_id() const override { return bytes_.bos_id(); }
  int32_t eos_id() const override { return data::ByteTokenizer::kUnk; }
  int64_t vocab_size() const override { return bytes_.vocab_size(); }
  std::string description() const override { return "bytes, eos 0"; }

 private:
  data::ByteTokenizer bytes_;
};

// Overwrites `count` bytes of `file` at `offset` with 0x11.
void poke(const fs::path& file, size_t offset, size_t count) {
  std::string bytes = test::read_file(file);
  ASSERT_LE(offset + count, bytes.size());
  std::fill(bytes.begin() + static_cast<std::ptrdiff_t>(offset), bytes.begin() + static_cast<std::ptrdiff_t>(offset + count), '\x11');
  test::write_file(file, bytes);
}

TEST(BaseFingerprint, TheSameWeightsAnywhereMatchAndOtherWeightsAreNamed) {
  const fs::path dir = test::make_temp_dir("fingerprint");
  InitModelOptions options;
  options.seed = 1;
  init_model(preset_or_fail("tiny"), dir / "a", options);
  fs::copy(dir / "a", dir / "moved", fs::copy_options::recursive);
  const data::ByteTokenizer bytes;
  const nlohmann::json a = base_fingerprint(model_at(dir / "a"), bytes);
  EXPECT_EQ(fingerprint_difference(a, base_fingerprint(model_at(dir / "moved"), bytes)), std::nullopt);

  // Another seed: every tensor differs but the norms (all ones).
  options.seed = 2;
  init_model(preset_or_fail("tiny"), dir / "b", options);
  const auto d = fingerprint_difference(a, base_fingerprint(model_at(dir / "b"), bytes));
  ASSERT_TRUE(d.has_value());
  EXPECT_TRUE(d->starts_with("the base weights: ")) << *d;
  EXPECT_NE(d->find(" tensors differ (first 'lm_head.weight')"), std::string::npos) << *d;

  // One tensor edited near its end: that tensor alone is named.
  fs::copy(dir / "a", dir / "edited", fs::copy_options::recursive);
  poke(dir / "edited" / "model.safetensors", fs::file_size(dir / "edited" / "model.safetensors") - 16, 16);
  const ModelWeights weights = ModelWeights::open(dir / "a");
  const std::string last = weights.tensor_names().back();
  EXPECT_EQ(fingerprint_difference(a, base_fingerprint(model_at(dir / "edited"), bytes)),
            fmt::format("the base weights: 1 of {} tensors differ (first '{}')", weights.tensor_names().size(), last));
}

TEST(BaseFingerprint, PresetsAndTokenizersAreComparedByWhatTheyAre) {
  const data::ByteTokenizer bytes;
  const nlohmann::json tiny = base_fingerprint(preset("tiny"), bytes);
  EXPECT_EQ(fingerprint_difference(tiny, base_fingerprint(preset("tiny"), bytes)), std::nullopt);
  EXPECT_EQ(fingerprint_difference(tiny, base_fingerprint(preset("llama2-7b"), bytes)),
            "the base weights: the checkpoint was made from preset:tiny, this run uses preset:llama2-7b");

  const auto d = fingerprint_difference(tiny, base_fingerprint(preset("tiny"), EosIsUnk()));
  ASSERT_TRUE(d.has_value());
  EXPECT_TRUE(d->starts_with("the tokenizer: checkpoint builtin:bytes (259 ids: <unk>, <s>, </s> and the 256 byte "
                             "values) (vocab 259, bos 1, eos 2, pad 2, digest "))
      << *d;
  EXPECT_NE(d->find("this run bytes, eos 0 (vocab 259, bos 1, eos 0, pad 0, digest "), std::string::npos) << *d;
  // The description (which names a file) alone does not count.
  nlohmann::json renamed = tiny;
  renamed["tokenizer"]["description"] = "sentencepiece /elsewhere/tokenizer.model";
  EXPECT_EQ(fingerprint_difference(tiny, renamed), std::nullopt);
}

}  // namespace
}  // namespace fsdpq
