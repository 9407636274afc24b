// `fsdpq tokenize` through the real binary: ids and pieces of a text or a JSONL file.
#include <gtest/gtest.h>

#include <filesystem>

#include "test_support.h"

namespace fsdpq {
namespace {
namespace fs = std::filesystem;
using test::quoted;
using test::run_fsdpq;


// The tiny byte-level BPE of tests/data with a tokenizer_config.json naming EOS.
fs::path tiny_bpe_folder() {
  const fs::path dir = test::make_temp_dir("cli-tokenize");
  fs::copy_file(fs::path(FSDPQ_SOURCE_DIR) / "tests" / "data" / "tiny_bpe" / "tokenizer.json", dir / "tokenizer.json");
  test::write_file(dir / "tokenizer_config.json", R"({"eos_token": "</s>"})");
  return dir;
}

TEST(CliTokenize, HelpAndUsage) {
  auto r = run_fsdpq("tokenize --help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("usage: fsdpq tokenize --tokenizer PATH (--text TEXT | --jsonl FILE) [--add-bos] [--pieces]"),
            std::string::npos)
      << r.output;
  r = run_fsdpq("--help");
  EXPECT_NE(r.output.find("fsdpq tokenize --tokenizer PATH --text TEXT"), std::string::npos) << r.output;
  r = run_fsdpq("tokenise --tokenizer builtin:bytes --text a");
  EXPECT_NE(r.output.find("(did you mean 'tokenize'?)"), std::string::npos) << r.output;
}

TEST(CliTokenize, TextGivesIdsAndPieces) {
  auto r = run_fsdpq("tokenize --tokenizer builtin:bytes --text Ab --pieces");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "{\"ids\":[68,101],\"pieces\":[\"<0x41>\",\"<0x62>\"]}\n");
  const fs::path tiny = tiny_bpe_folder();
  r = run_fsdpq("tokenize --tokenizer " + quoted(tiny.string()) + " --text 'the <s>' --add-bos --pieces");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // What Hugging Face's encode(text) gives, its template's <s> first.
  EXPECT_EQ(r.output, "{\"ids\":[0,84,118,102,0],\"pieces\":[\"<s>\",\"t\",\"he\",\"Ġ\",\"<s>\"]}\n");
}

TEST(CliTokenize, Llama3AsHuggingFaceEncodesIt) {
  FSDPQ_SHARED_DATA_OR_SKIP(llama3, "llama3/tokenizer.json");
  const std::string chat = "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>";
  for (const fs::path& tokenizer : {llama3, llama3.parent_path() / "tokenizer.model", llama3.parent_path()}) {
    auto r = run_fsdpq("tokenize --tokenizer " + quoted(tokenizer.string()) + " --add-bos --text " + quoted(chat));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output, "{\"ids\":[128000,128006,882,128007,271,13347,128009]}\n") << tokenizer;
  }
  auto r = run_fsdpq("tokenize --tokenizer " + quoted(llama3.string()) + " --pieces --text 'Hello world'");
  EXPECT_EQ(r.output, "{\"ids\":[9906,1917],\"pieces\":[\"Hello\",\"Ġworld\"]}\n");
}

TEST(CliTokenize, JsonlGivesALinePerRecord) {
  const fs::path dir = test::make_temp_dir("cli-tokenize-jsonl");
  test::write_file(dir / "in.jsonl", "{\"text\": \"Ab\"}\n\n{\"text\": \"\", \"other\": 1}\n{\"text\": \"\\n\"}\n");
  auto r = run_fsdpq("tokenize --tokenizer builtin:bytes --jsonl " + quoted((dir / "in.jsonl").string()));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "{\"ids\":[68,101]}\n{\"ids\":[]}\n{\"ids\":[13]}\n");
  r = run_fsdpq("tokenize --tokenizer builtin:bytes --add-bos --jsonl " + quoted((dir / "in.jsonl").string()));
  EXPECT_EQ(r.output, "{\"ids\":[1,68,101]}\n{\"ids\":[1]}\n{\"ids\":[1,13]}\n");
}

TEST(CliTokenize, ErrorsSayWhatIsWrong) {
  const fs::path dir = test::make_temp_dir("cli-tokenize-errors");
  test::write_file(dir / "bad.jsonl", "{\"text\": \"fine\"}\n[\"not\", \"an object\"]\n");
  const std::string bad = (dir / "bad.jsonl").string();
  struct Case {
    std::string args, error;
  } cases[] = {
      {"tokenize --tokenizer builtin:bytes", "fsdpq: error: tokenize: give exactly one of --text TEXT and --jsonl FILE"},
      {"tokenize --tokenizer builtin:bytes --text a --jsonl " + quoted(bad),
       "fsdpq: error: tokenize: give exactly one of --text TEXT and --jsonl FILE"},
      {"tokenize --text a", "fsdpq: error: tokenize: --tokenizer PATH is required"},
      {"tokenize --tokenizer builtin:bytes --jsonl " + quoted(bad),
       "fsdpq: error: " + bad + ":2: expected a JSON object with a \"text\" string, one per line"},
      {"tokenize --tokenizer builtin:bytes --jsonl " + quoted((dir / "missing.jsonl").string()),
       "fsdpq: error: tokenize: cannot read --jsonl " + (dir / "missing.jsonl").string() +
           "; expected a JSONL file of {\"text\": \"...\"} lines"},
      {"tokenize --tokenizer " + quoted((dir / "none").string()) + " --text a",
       "fsdpq: error: tokenizer '" + (dir / "none").string() +
           "' does not exist; expected a tokenizer.model, a tokenizer.json or a model folder holding one"},
  };
  for (const Case& c : cases) {
    auto r = run_fsdpq(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.error + "\n"), std::string::npos) << c.args << "\n" << r.output;
  }
}

// A model folder that carries Llama-3's tokenizer.json: a run uses it without tokenizer_path.
TEST(CliTokenize, DryRunOnALlama3FolderReadsItsTokenizerJson) {
  FSDPQ_SHARED_DATA_OR_SKIP(llama3, "llama3/tokenizer.json");
  FSDPQ_SHARED_DATA_OR_SKIP(sql, "sql.jsonl");
  const fs::path dir = test::make_temp_dir("cli-llama3-folder");
  auto r = run_fsdpq("init-model --preset tiny --vocab_size 128256 --out " + quoted((dir / "model").string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"})
    fs::create_symlink(llama3.parent_path() / file, dir / "model" / file);
  r = test::run_command(std::string("cd '") + FSDPQ_SOURCE_DIR + "' && '" + FSDPQ_BINARY +
                        "' --dry_run inputs/sql.ini --model_name " + quoted((dir / "model").string()) +
                        " --data_path " + quoted(sql.string()) + " --output_dir " + quoted((dir / "out").string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tokenizer: tokenizer.json " + (dir / "model" / "tokenizer.json").string() +
                          " (byte-level BPE, 128256 ids: 128000 tokens, 280147 merges, 256 added tokens) (bos "
                          "128000, eos 128001, pad 128001)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("records: 4000 read, 0 skipped"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace fsdpq
