// Bad byte-level tokenizer files: each is a UserError that names the file and what is wrong.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "data/tokenizer.h"
#include "test_support.h"

namespace fsdpq::data {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using test::error_of;

const fs::path kTinyBpe = fs::path(FSDPQ_SOURCE_DIR) / "tests" / "data" / "tiny_bpe" / "tokenizer.json";

class BpeFileErrors : public ::testing::Test {
 protected:
  // The tiny tokenizer.json with `patch` applied, written as DIR/tokenizer.json; the error that
  // loading it gives, with the file's path written as FILE.
  std::string error_with(const json& patch) {
    json spec = json::parse(test::read_file(kTinyBpe));
    spec.merge_patch(patch);
    return error_of_text(spec.dump());
  }
  std::string error_of_text(const std::string& text, const std::string& name = "tokenizer.json") {
    const fs::path file = dir_ / name;
    test::write_file(file, text);
    std::string message = error_of([&] { load_tokenizer(file.string()); });
    for (size_t at; (at = message.find(file.string())) != std::string::npos;) message.replace(at, file.string().size(), "FILE");
    return message;
  }
  fs::path dir_ = test::make_temp_dir("bpe-errors");
};

TEST_F(BpeFileErrors, BrokenJson) {
  const std::string text = test::read_file(kTinyBpe);
  EXPECT_EQ(error_of_text(text.substr(0, 1000)),
            "tokenizer 'FILE': not valid JSON (parse error at line 70, column 3: syntax error while parsing "
            "array - unexpected end of input; expected ']'); expected a Hugging Face tokenizer.json");
  EXPECT_EQ(error_of_text("{\"model\": [1, 2]}"), "tokenizer 'FILE': no \"model\" object; expected a Hugging Face tokenizer.json");
  // A folder's tokenizer.json is read the same way.
  EXPECT_EQ(error_of([&] { load_tokenizer(dir_.string()); }),
            "tokenizer '" + (dir_ / "tokenizer.json").string() + "': no \"model\" object; expected a Hugging Face tokenizer.json");
}

TEST_F(BpeFileErrors, OtherModelTypes) {
  for (const std::string type : {"WordPiece", "Unigram", "WordLevel"})
    EXPECT_EQ(error_with({{"model", {{"type", type}}}}),
              "tokenizer 'FILE': model type '" + type +
                  "' is not supported; fsdpq reads byte-level BPE tokenizers (model type BPE, as Llama-3, GPT-2 "
                  "and Qwen ship)");
}

TEST_F(BpeFileErrors, MergesThatDoNotFit) {
  json spec = json::parse(test::read_file(kTinyBpe));
  auto merges = spec["model"]["merges"];
  merges[5] = "Ġ notatoken";
  EXPECT_EQ(error_with({{"model", {{"merges", merges}}}}),
            "tokenizer 'FILE': merges entry 6 (\"Ġ notatoken\") names \"notatoken\", which is not in the vocab; every "
            "merge must join two vocab tokens into a third");
  merges[5] = json::array({"q", "z"});  // both tokens, but "qz" is not
  EXPECT_EQ(error_with({{"model", {{"merges", merges}}}}),
            "tokenizer 'FILE': merges entry 6 ([\"q\",\"z\"]) names \"qz\", which is not in the vocab; every merge "
            "must join two vocab tokens into a third");
  merges[5] = "a b c";
  EXPECT_EQ(error_with({{"model", {{"merges", merges}}}}),
            "tokenizer 'FILE': merges entry 6 (\"a b c\") is not two tokens separated by one space");
  merges[5] = 7;
  EXPECT_EQ(error_with({{"model", {{"merges", merges}}}}),
            "tokenizer 'FILE': merges entry 6 is 7; expected \"a b\" or [\"a\", \"b\"]");
}

TEST_F(BpeFileErrors, WhatFsdpqCannotDoExactly) {
  EXPECT_EQ(error_with({{"normalizer", {{"type", "NFC"}}}}),
            "tokenizer 'FILE': normalizer '\"NFC\"' is not supported; fsdpq reads byte-level tokenizers without a "
            "normalizer (\"normalizer\": null, as Llama-3's)");
  EXPECT_EQ(error_with({{"model", {{"dropout", 0.1}}}}),
            "tokenizer 'FILE': BPE dropout 0.1 is not supported; fsdpq encodes deterministically (\"dropout\": null)");
  EXPECT_EQ(error_with({{"pre_tokenizer", {{"type", "Metaspace"}}}}),
            "tokenizer 'FILE': pre-tokenizer 'Metaspace' is not supported; fsdpq reads byte-level tokenizers, whose "
            "pre_tokenizer is Split and ByteLevel steps");
  EXPECT_EQ(error_with({{"pre_tokenizer", nullptr}}),
            "tokenizer 'FILE': the pre_tokenizer has 0 ByteLevel step(s); fsdpq reads byte-level tokenizers, whose "
            "pre_tokenizer ends with its one ByteLevel step");
  EXPECT_EQ(error_with(json::parse(R"({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false},
                {"type": "Split", "pattern": {"Regex": "\\s"}, "behavior": "Isolated", "invert": false}]}})")),
            "tokenizer 'FILE': the pre_tokenizer has 1 ByteLevel step(s), not at the end; fsdpq reads byte-level "
            "tokenizers, whose pre_tokenizer ends with its one ByteLevel step");
  EXPECT_EQ(error_with({{"decoder", {{"type", "Metaspace"}}}}),
            "tokenizer 'FILE': decoder \"Metaspace\" is not supported; byte-level tokenizers decode with ByteLevel");
  EXPECT_EQ(error_with({{"post_processor", {{"type", "RobertaProcessing"}}}}),
            "tokenizer 'FILE': post-processor 'RobertaProcessing' is not supported; expected TemplateProcessing, "
            "ByteLevel, a Sequence of them, or null");
}

TEST_F(BpeFileErrors, ARegexPcre2Rejects) {
  EXPECT_EQ(error_with(json::parse(R"({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": "\\p{L}+|(?<=a+)b"}, "behavior": "Isolated", "invert": false},
                {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]}})")),
            "tokenizer 'FILE': pre_tokenizer Split: the regex \"\\\\p{L}+|(?<=a+)b\" is not one PCRE2 accepts: "
            "lookbehind assertion is not fixed length at offset 7; expected a regex in the Oniguruma / PCRE "
            "syntax that Hugging Face tokenizers use");
}

TEST_F(BpeFileErrors, SpecialTokenNamesThatAreNotTokens) {
  json spec = json::parse(test::read_file(kTinyBpe));
  test::write_file(dir_ / "tokenizer_config.json", R"({"eos_token": "<|eot_id|>"})");
  EXPECT_EQ(error_of_text(spec.dump()),
            "tokenizer 'FILE': eos_token '<|eot_id|>' (tokenizer_config.json at " + (dir_ / "tokenizer_config.json").string() +
                ") is not a token of the tokenizer; expected one of its added tokens (such as <|end_of_text|>) or a "
                "vocabulary entry");
  test::write_file(dir_ / "tokenizer_config.json", R"({"eos_token": 5})");
  EXPECT_EQ(error_of_text(spec.dump()),
            "'" + (dir_ / "tokenizer_config.json").string() +
                "': \"eos_token\" is 5; expected a token name (a string, or an object with \"content\")");
  std::filesystem::remove(dir_ / "tokenizer_config.json");
  EXPECT_EQ(error_of_text(spec.dump()),
            "tokenizer 'FILE' names no EOS token (there is no tokenizer_config.json beside it); fsdpq needs one, as "
            "training ends every example with EOS: put a tokenizer_config.json with \"eos_token\" beside it");
}

TEST_F(BpeFileErrors, TextThatIsNotUtf8) {
  test::write_file(dir_ / "tokenizer_config.json", R"({"eos_token": "</s>"})");
  test::write_file(dir_ / "tokenizer.json", test::read_file(kTinyBpe));
  auto tok = load_tokenizer(dir_.string());
  EXPECT_EQ(error_of([&] { tok->encode("ok \xff bad"); }),
            "tokenizer '" + (dir_ / "tokenizer.json").string() +
                "' cannot encode a text of 8 bytes that is not valid UTF-8; expected UTF-8 text");
}

TEST_F(BpeFileErrors, BadTiktokenLines) {
  const std::string good = "IQ== 0\nIg== 1\n";  // "!", "\""
  EXPECT_EQ(error_of_text(good + "Iw== 2 extra\n", "tokenizer.model"),
            "tokenizer 'FILE' line 3: expected a base64 token, a space and a rank (Meta's tiktoken format), found "
            "'Iw== 2 extra'");
  EXPECT_EQ(error_of_text(good + "I*== 2\n", "tokenizer.model"), "tokenizer 'FILE' line 3: the token 'I*==' is not base64");
  EXPECT_EQ(error_of_text(good + "Iw== two\n", "tokenizer.model"),
            "tokenizer 'FILE' line 3: the rank 'two' is not a non-negative integer below 2^31 - 256");
  EXPECT_EQ(error_of_text(good + "Iw== 1\n", "tokenizer.model"),
            "tokenizer 'FILE' line 3: the rank 1 is given again (first on line 2)");
  EXPECT_EQ(error_of_text(good + "IQ== 2\n", "tokenizer.model"),
            "tokenizer 'FILE' line 3: the token 'IQ==' is given again (first on line 1)");
  EXPECT_EQ(error_of_text(good + "Iw== 7\n", "tokenizer.model"),
            "tokenizer 'FILE': rank 7 is not below the number of tokens (3); Meta's tiktoken files number their "
            "tokens 0 to 2 and the special tokens from 3");
  EXPECT_EQ(error_of_text(good, "tokenizer.model"),
            "tokenizer 'FILE' has no token for the byte 0x00; a byte-level BPE file has all 256 single bytes");
}

std::string base64(const std::string& bytes) {
  static const char* kDigits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t chunk = 0;
    for (size_t k = 0; k < 3; ++k) chunk = chunk << 8 | (k < n ? static_cast<unsigned char>(bytes[i + k]) : 0u);
    for (size_t k = 0; k < 4; ++k) out += k <= n ? kDigits[(chunk >> (18 - 6 * k)) & 63] : '=';
  }
  return out;
}

// All 256 bytes and a few merges: a tiktoken file small enough to write here.
TEST(TiktokenFile, ASmallFileEncodesByRank) {
  const fs::path dir = test::make_temp_dir("tiktoken");
  std::string text;
  for (int b = 0; b < 256; ++b) text += base64(std::string(1, static_cast<char>(b))) + " " + std::to_string(b) + "\n";
  // "bc" ranks before "ab": "abc" becomes a + bc, as tiktoken merges the lowest-ranked pair first.
  text += base64("bc") + " 256\n" + base64("ab") + " 257\n" + base64("abcd") + " 258\n";
  test::write_file(dir / "tokenizer.model", text);
  auto tok = load_tokenizer(dir.string());
  EXPECT_EQ(tok->description(), "tiktoken " + (dir / "tokenizer.model").string() +
                                    " (byte-level BPE, 515 ids: 259 ranks + 256 Llama-3 special tokens)");
  EXPECT_EQ(tok->encode("abc"), (std::vector<int32_t>{'a', 256}));
  EXPECT_EQ(tok->encode("ab"), (std::vector<int32_t>{257}));
  EXPECT_EQ(tok->encode("abcd"), (std::vector<int32_t>{258})) << "a whole piece that is a token is that token";
  EXPECT_EQ(tok->encode("abcd<|eot_id|>"), (std::vector<int32_t>{258, 259 + 9}));
  EXPECT_EQ(tok->bos_id(), 259);
  EXPECT_EQ(tok->eos_id(), 260);
  EXPECT_EQ(tok->decode(tok->encode("bcab abc\n")), "bcab abc\n");
}

}  // namespace
}  // namespace fsdpq::data
