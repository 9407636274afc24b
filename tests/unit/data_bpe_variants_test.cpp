// A small byte-level BPE (tests/data/tiny_bpe, trained by tests/reference/llama3_token_ids.py) in
// many variants — pre-tokenizers, Split behaviours, added-token flags, unk and byte fallback — each
// against Hugging Face tokenizers' ids for every corpus text. Needs no shared data.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "data/bpe_tokenizer.h"
#include "data/tokenizer.h"
#include "test_support.h"
#include "token_digest.h"

namespace fsdpq::data {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using Ids = std::vector<int32_t>;

const fs::path kTestData = fs::path(FSDPQ_SOURCE_DIR) / "tests" / "data";

json read_json(const fs::path& file) { return json::parse(test::read_file(file)); }

// A folder holding the base tokenizer.json with `patch` applied (RFC 7386), and a
// tokenizer_config.json that names EOS.
fs::path write_variant(const std::string& name, const json& patch) {
  json spec = read_json(kTestData / "tiny_bpe" / "tokenizer.json");
  spec.merge_patch(patch);
  const fs::path dir = test::make_temp_dir("tiny-bpe-" + name);
  test::write_file(dir / "tokenizer.json", spec.dump());
  test::write_file(dir / "tokenizer_config.json", R"({"eos_token": "</s>"})");
  return dir;
}

json variants() { return read_json(kTestData / "tiny_bpe_variants.json"); }

std::vector<std::string> variant_names() {
  std::vector<std::string> names;
  for (const json& v : variants()) names.push_back(v.at("name").get<std::string>());
  return names;
}

class TinyBpe : public ::testing::TestWithParam<std::string> {};

TEST_P(TinyBpe, EveryCorpusTextGivesTheReferenceIds) {
  json variant;
  for (const json& v : variants())
    if (v.at("name") == GetParam()) variant = v;
  const auto texts = read_json(kTestData / "tokenizer_corpus.json").get<std::vector<std::string>>();
  const auto expected = variant.at("digests").get<std::vector<std::string>>();
  ASSERT_EQ(texts.size(), expected.size()) << "rerun tests/reference/llama3_token_ids.py";
  auto tok = load_tokenizer(write_variant(GetParam(), variant.at("patch")).string());
  size_t wrong = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const Ids ids = tok->encode(texts[i]);
    const test::Digest got = test::digest_of_ids({ids});
    const test::Digest want = test::parse_digest(expected[i], false);
    EXPECT_EQ(got, want) << "corpus text " << i << " " << json(texts[i]).dump() << " gave " << json(ids).dump();
    wrong += got != want;
  }
  EXPECT_EQ(wrong, 0u) << "of " << texts.size() << " corpus texts";
}

INSTANTIATE_TEST_SUITE_P(Variants, TinyBpe, ::testing::ValuesIn(variant_names()),
                         [](const auto& info) { return info.param; });

TEST(TinyBpeTokenizer, BasicsOfTheBase) {
  const fs::path dir = write_variant("base", json::object());
  auto tok = load_tokenizer(dir.string());
  EXPECT_EQ(tok->vocab_size(), 600);
  EXPECT_EQ(tok->bos_id(), 0) << "no bos_token in the config: the template's first token";
  EXPECT_EQ(tok->eos_id(), 1);
  EXPECT_EQ(tok->pad_id(), 1);
  EXPECT_EQ(tok->template_bos_id(), 0);
  // 496 merges: the "#version" line of the "a b" list is not one.
  EXPECT_EQ(tok->description(), "tokenizer.json " + (dir / "tokenizer.json").string() +
                                    " (byte-level BPE, 600 ids: 600 tokens, 496 merges, 2 added tokens)");
  // ASCII only in its alphabet: other bytes are dropped, as Hugging Face drops them without unk.
  EXPECT_EQ(tok->decode(tok->encode("caf\xc3\xa9 ok")), "caf ok");
  EXPECT_EQ(tok->decode(tok->encode("the quick brown fox")), "the quick brown fox");
  EXPECT_EQ(tok->encode(""), Ids{});
}

// A tokenizer.json is known by its content, even under another name and after a byte order mark.
TEST(TinyBpeTokenizer, ReadByContent) {
  const fs::path dir = write_variant("by-content", json::object());
  test::write_file(dir / "vocab.txt", "\xEF\xBB\xBF\n" + test::read_file(dir / "tokenizer.json"));
  auto tok = load_tokenizer((dir / "vocab.txt").string());
  EXPECT_EQ(tok->vocab_size(), 600);
  EXPECT_EQ(tok->description().rfind("tokenizer.json " + (dir / "vocab.txt").string(), 0), 0u);
}

TEST(TinyBpeTokenizer, TemplateSuffixAndPrefix) {
  const json patch = json::parse(R"({"post_processor": {"type": "Sequence", "processors": [
      {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
      {"type": "TemplateProcessing",
       "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                  {"SpecialToken": {"id": "</s>", "type_id": 0}}],
       "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]},
                          "</s>": {"id": "</s>", "ids": [1], "tokens": ["</s>"]}}}]}})");
  auto tok = load_tokenizer(write_variant("template", patch).string());
  const auto& bpe = dynamic_cast<const BpeTokenizer&>(*tok);
  EXPECT_EQ(bpe.template_prefix(), Ids{0});
  EXPECT_EQ(bpe.template_suffix(), Ids{1});
  // Without a template and without bos_token there is no BOS to use.
  const fs::path dir = write_variant("no-template", json::parse(R"({"post_processor": null})"));
  EXPECT_EQ(test::error_of([&] { load_tokenizer(dir.string()); }),
            "tokenizer '" + (dir / "tokenizer.json").string() +
                "' names no BOS token (tokenizer_config.json at " + (dir / "tokenizer_config.json").string() +
                "), and its post-processor puts none first; fsdpq needs one, as fsdp_qlora starts every "
                "example with BOS");
}

}  // namespace
}  // namespace fsdpq::data
