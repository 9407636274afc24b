// The real Llama-3 tokenizer (../shared/data/llama3) in both file formats against the ids of the
// reference implementations (Hugging Face tokenizers on tokenizer.json, tiktoken on
// tokenizer.model), written by tests/reference/llama3_token_ids.py into tests/data.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "data/bpe_tokenizer.h"
#include "data/tokenizer.h"
#include "test_support.h"
#include "token_digest.h"

namespace fsdpq::data {
namespace {
namespace fs = std::filesystem;
using Ids = std::vector<int32_t>;
using test::digest_of;

const fs::path kTestData = fs::path(FSDPQ_SOURCE_DIR) / "tests" / "data";

std::vector<std::string> corpus() {
  const auto texts = nlohmann::json::parse(test::read_file(kTestData / "tokenizer_corpus.json"));
  return texts.get<std::vector<std::string>>();
}

// The ids the reference gave each corpus text, for "tokenizer.json" or "tokenizer.model".
std::vector<Ids> expected_corpus_ids(const std::string& format) {
  const auto all = nlohmann::json::parse(test::read_file(kTestData / "llama3_corpus_ids.json"));
  return all.at(format).get<std::vector<Ids>>();
}

// One tokenizer per file, loaded once for the suite (a 17 MB tokenizer.json takes a while).
const Tokenizer& llama3(const std::string& file) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> loaded;
  auto& tokenizer = loaded[file];
  if (!tokenizer) tokenizer = load_tokenizer((*test::shared_data_dir() / "llama3" / file).string());
  return *tokenizer;
}

class Llama3 : public ::testing::TestWithParam<std::string> {};

TEST_P(Llama3, CorpusIdsEqualTheReference) {
  FSDPQ_SHARED_DATA_OR_SKIP(file, "llama3/" + GetParam());
  const Tokenizer& tok = llama3(GetParam());
  const std::vector<std::string> texts = corpus();
  const std::vector<Ids> expected = expected_corpus_ids(GetParam());
  ASSERT_EQ(texts.size(), expected.size()) << "rerun tests/reference/llama3_token_ids.py";
  size_t wrong = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const Ids ids = tok.encode(texts[i]);
    EXPECT_EQ(ids, expected[i]) << "corpus text " << i << ": " << nlohmann::json(texts[i]).dump();
    wrong += ids != expected[i];
  }
  EXPECT_EQ(wrong, 0u) << "of " << texts.size() << " corpus texts";
}

// decode(encode(text)) == text, except that BOS / EOS / padding decode to nothing.
TEST_P(Llama3, DecodeGivesBackTheText) {
  FSDPQ_SHARED_DATA_OR_SKIP(file, "llama3/" + GetParam());
  const Tokenizer& tok = llama3(GetParam());
  for (const std::string& text : corpus()) {
    std::string without_specials = text;
    for (const std::string special : {"<|begin_of_text|>", "<|end_of_text|>"})
      for (size_t at; (at = without_specials.find(special)) != std::string::npos;)
        without_specials.erase(at, special.size());
    EXPECT_EQ(tok.decode(tok.encode(text)), without_specials) << nlohmann::json(text).dump();
  }
}

// Every record of alpaca.jsonl and sql.jsonl: the digest of its texts' ids equals the reference's.
TEST_P(Llama3, SharedDataRecordsEqualTheReference) {
  FSDPQ_SHARED_DATA_OR_SKIP(alpaca, "alpaca.jsonl");
  FSDPQ_SHARED_DATA_OR_SKIP(sql, "sql.jsonl");
  FSDPQ_SHARED_DATA_OR_SKIP(file, "llama3/" + GetParam());
  const Tokenizer& tok = llama3(GetParam());
  const bool tiktoken = GetParam() == "tokenizer.model";
  std::istringstream digests(test::read_file(kTestData / "llama3_shared_digests.txt"));
  std::string line;
  size_t checked = 0;
  for (const fs::path& data : {alpaca, sql}) {
    while (std::getline(digests, line) && line.rfind("#", 0) == 0) {}
    std::istringstream header(line);
    std::string name;
    size_t count = 0;
    header >> name >> count;
    ASSERT_EQ(name, data.filename().string()) << "tests/data/llama3_shared_digests.txt is out of step";
    std::ifstream records(data);
    std::string record_line;
    for (size_t index = 0; index < count; ++index) {
      ASSERT_TRUE(std::getline(records, record_line)) << data << " has fewer than " << count << " records";
      ASSERT_TRUE(std::getline(digests, line));
      const test::Digest expected = test::parse_digest(line, tiktoken);
      const test::Digest got = digest_of(tok, test::record_texts(record_line, name));
      ASSERT_EQ(got, expected) << name << " record " << index << " (line " << index + 1
                               << ") encodes to other ids than the reference";
      ++checked;
    }
  }
  EXPECT_EQ(checked, 9000u);
}

INSTANTIATE_TEST_SUITE_P(BothFormats, Llama3, ::testing::Values("tokenizer.json", "tokenizer.model"),
                         [](const auto& info) { return info.param == "tokenizer.json" ? "TokenizerJson" : "Tiktoken"; });

TEST(Llama3Tokenizer, SpecialTokensSizesAndDescription) {
  FSDPQ_SHARED_DATA_OR_SKIP(dir, "llama3");
  for (const std::string file : {"tokenizer.json", "tokenizer.model"}) {
    const Tokenizer& tok = llama3(file);
    EXPECT_EQ(tok.vocab_size(), 128256) << file;
    EXPECT_EQ(tok.bos_id(), 128000) << file;
    EXPECT_EQ(tok.eos_id(), 128001) << file;
    EXPECT_EQ(tok.pad_id(), 128001) << file << ": no pad token, so pad = eos as fsdp_qlora sets it";
    EXPECT_EQ(tok.template_bos_id(), 128000) << file;
    EXPECT_EQ(tok.encode("Hello world"), (Ids{9906, 1917})) << file;
    EXPECT_EQ(tok.piece(1917), "Ġworld") << file;
    EXPECT_EQ(tok.piece(128009), "<|eot_id|>") << file;
    EXPECT_EQ(tok.piece(128256), "") << file;
    EXPECT_EQ(tok.decode({128000, 9906, 1917, 128001}), "Hello world") << file;
    EXPECT_EQ(tok.decode({-1, 128256, 9906}), "Hello") << file << ": unknown ids decode to nothing";
  }
  EXPECT_EQ(llama3("tokenizer.json").description(),
            "tokenizer.json " + (dir / "tokenizer.json").string() +
                " (byte-level BPE, 128256 ids: 128000 tokens, 280147 merges, 256 added tokens)");
  EXPECT_EQ(llama3("tokenizer.model").description(),
            "tiktoken " + (dir / "tokenizer.model").string() +
                " (byte-level BPE, 128256 ids: 128000 ranks + 256 Llama-3 special tokens)");
  // A cut through a character decodes to its bytes as they are: ☃ is E2 98 | 83.
  EXPECT_EQ(llama3("tokenizer.json").encode("\xe2\x98\x83"), (Ids{18107, 225}));
  EXPECT_EQ(llama3("tokenizer.json").decode({18107}), "\xe2\x98");
}

TEST(Llama3Tokenizer, AFolderPicksTokenizerJsonAndItsConfig) {
  FSDPQ_SHARED_DATA_OR_SKIP(dir, "llama3");
  auto from_folder = load_tokenizer(dir.string());
  EXPECT_EQ(from_folder->description().rfind("tokenizer.json " + (dir / "tokenizer.json").string(), 0), 0u)
      << from_folder->description();
  // A sentencepiece tokenizer.model comes first (Llama-2 / Mistral folders may carry both).
  const fs::path llama2 = dir.parent_path() / "tokenizer.model";
  if (fs::exists(llama2)) {
    const fs::path both = test::make_temp_dir("llama2-both");
    fs::create_symlink(llama2, both / "tokenizer.model");
    fs::create_symlink(dir / "tokenizer.json", both / "tokenizer.json");
    EXPECT_EQ(load_tokenizer(both.string())->description().rfind("sentencepiece ", 0), 0u);
  }
  // A file is read by its content, whatever its name.
  const fs::path renamed = test::make_temp_dir("llama3-renamed");
  fs::create_symlink(dir / "tokenizer.json", renamed / "vocab.bin");
  fs::create_symlink(dir / "tokenizer.model", renamed / "llama3.tiktoken");
  fs::create_symlink(dir / "tokenizer_config.json", renamed / "tokenizer_config.json");
  EXPECT_EQ(load_tokenizer((renamed / "vocab.bin").string())->description().rfind("tokenizer.json ", 0), 0u);
  EXPECT_EQ(load_tokenizer((renamed / "llama3.tiktoken").string())->description().rfind("tiktoken ", 0), 0u);
  // Without tokenizer.json the folder's tiktoken tokenizer.model is used.
  const fs::path only_model = test::make_temp_dir("llama3-tiktoken");
  fs::create_symlink(dir / "tokenizer.model", only_model / "tokenizer.model");
  auto tiktoken = load_tokenizer(only_model.string());
  EXPECT_EQ(tiktoken->description().rfind("tiktoken ", 0), 0u) << tiktoken->description();
  EXPECT_EQ(tiktoken->encode("<|eot_id|>"), Ids{128009});
}

TEST(Llama3Tokenizer, ConfigNamesEosAndPad) {
  FSDPQ_SHARED_DATA_OR_SKIP(dir, "llama3");
  // An instruct model's config: EOS is <|eot_id|>, and a pad token of its own.
  const fs::path folder = test::make_temp_dir("llama3-instruct");
  fs::create_symlink(dir / "tokenizer.json", folder / "tokenizer.json");
  fs::create_symlink(dir / "tokenizer.model", folder / "tokenizer.model");
  test::write_file(folder / "tokenizer_config.json",
                   R"({"bos_token": {"content": "<|begin_of_text|>", "__type": "AddedToken"},
                       "eos_token": "<|eot_id|>", "pad_token": "<|finetune_right_pad_id|>"})");
  for (const std::string file : {"tokenizer.json", "tokenizer.model"}) {
    auto tok = load_tokenizer((folder / file).string());
    EXPECT_EQ(tok->bos_id(), 128000) << file;
    EXPECT_EQ(tok->eos_id(), 128009) << file;
    EXPECT_EQ(tok->pad_id(), 128004) << file;
  }
}

// The data pipeline encodes records on OpenMP threads: each must get exactly the one-thread ids.
TEST(Llama3Tokenizer, SameIdsOnManyThreads) {
  FSDPQ_SHARED_DATA_OR_SKIP(dir, "llama3");
  const std::vector<std::string> texts = corpus();
  for (const std::string file : {"tokenizer.json", "tokenizer.model"}) {
    const Tokenizer& tok = llama3(file);
    std::vector<Ids> serial;
    for (const auto& t : texts) serial.push_back(tok.encode(t));
    constexpr int kRounds = 20;
    std::vector<Ids> parallel(texts.size() * kRounds);
#pragma omp parallel for num_threads(8) schedule(dynamic, 1)
    for (int64_t i = 0; i < static_cast<int64_t>(parallel.size()); ++i) parallel[i] = tok.encode(texts[i % texts.size()]);
    for (size_t i = 0; i < parallel.size(); ++i) ASSERT_EQ(parallel[i], serial[i % texts.size()]) << file << " text " << i;
  }
}

}  // namespace
}  // namespace fsdpq::data
