// Tokenizers: golden Llama-2 ids, the byte tokenizer, training a sentencepiece model.
#include <gtest/gtest.h>

#include "data/synthetic.h"
#include "data/tokenizer.h"
#include "test_support.h"
#include "util/error.h"

namespace fsdpq::data {
namespace {
namespace fs = std::filesystem;
using Ids = std::vector<int32_t>;

using test::error_of;

TEST(DataTokenizer, Llama2GoldenIds) {
  FSDPQ_SHARED_DATA_OR_SKIP(model, "tokenizer.model");
  auto tok = load_tokenizer(model.string());
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_EQ(tok->pad_id(), 2);  // fsdp_qlora pads with EOS
  EXPECT_EQ(tok->vocab_size(), 32000);

  // What HF's LlamaTokenizer gives: BOS + sentencepiece ids.
  Ids hello = tok->encode("Hello world");
  hello.insert(hello.begin(), tok->bos_id());
  EXPECT_EQ(hello, (Ids{1, 15043, 3186}));
  EXPECT_EQ(tok->encode("hello"), (Ids{22172}));
  EXPECT_EQ(tok->encode("\n"), (Ids{29871, 13}));                            // "▁", <0x0A>
  EXPECT_EQ(tok->encode("1234"), (Ids{29871, 29896, 29906, 29941, 29946}));  // digits split
  EXPECT_EQ(tok->encode(""), Ids{});
  EXPECT_EQ(tok->decode({1, 15043, 3186, 2}), "Hello world");
  EXPECT_EQ(tok->piece(15043), "\xe2\x96\x81Hello");  // ▁Hello
  EXPECT_EQ(tok->piece(13), "<0x0A>");
  EXPECT_EQ(tok->piece(32000), "");
  EXPECT_EQ(tok->template_bos_id(), std::nullopt);
  EXPECT_EQ(tok->description(), "sentencepiece " + model.string() + " (32000 pieces)");

  // A model folder works too.
  auto from_dir = load_tokenizer(model.parent_path().string());
  EXPECT_EQ(from_dir->encode("Hello world"), (Ids{15043, 3186}));
}

TEST(DataTokenizer, ByteTokenizerRoundTrip) {
  auto tok = load_tokenizer("builtin:bytes");
  EXPECT_EQ(tok->vocab_size(), 259);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_EQ(tok->pad_id(), 2);
  EXPECT_EQ(tok->encode("Ab"), (Ids{65 + 3, 98 + 3}));
  EXPECT_EQ(tok->piece(65 + 3), "<0x41>");
  EXPECT_EQ(tok->piece(1), "<s>");
  EXPECT_EQ(tok->piece(259), "");
  const std::string text = std::string("caf\xc3\xa9 \n\x01\xff", 9) + std::string(1, '\0') + "end";
  Ids ids = tok->encode(text);
  ASSERT_EQ(ids.size(), text.size());
  for (int32_t id : ids) {
    EXPECT_GE(id, 3);
    EXPECT_LT(id, 259);
  }
  EXPECT_EQ(tok->decode(ids), text);
  ids.insert(ids.begin(), 1);
  ids.push_back(2);
  ids.push_back(0);
  EXPECT_EQ(tok->decode(ids), text);  // specials decode to nothing
}

TEST(DataTokenizer, LoadErrorsNameThePath) {
  fs::path dir = test::make_temp_dir("data-tok");
  EXPECT_EQ(error_of([&] { load_tokenizer((dir / "nope.model").string()); }),
            "tokenizer '" + (dir / "nope.model").string() +
                "' does not exist; expected a tokenizer.model, a tokenizer.json or a model folder "
                "holding one");
  test::write_file(dir / "garbage.model", "this is not a protobuf");
  EXPECT_EQ(error_of([&] { load_tokenizer((dir / "garbage.model").string()); }),
            "tokenizer '" + (dir / "garbage.model").string() +
                "' is not a sentencepiece model; expected a tokenizer.model such as the one in a "
                "Llama model folder");
  EXPECT_EQ(error_of([&] { load_tokenizer(dir.string()); }),
            "tokenizer folder '" + dir.string() +
                "' has neither tokenizer.model nor tokenizer.json; expected a sentencepiece or "
                "tiktoken tokenizer.model, or a Hugging Face tokenizer.json");
  EXPECT_EQ(
      error_of([] { load_tokenizer("builtin:words"); }),
      "unknown built-in tokenizer 'builtin:words'; the only built-in tokenizer is builtin:bytes");
  EXPECT_EQ(error_of([] { load_tokenizer(" "); }),
            "tokenizer is empty; expected a tokenizer.model or tokenizer.json path, a model "
            "folder holding one, or builtin:bytes");
}

TEST(DataTokenizer, TrainOnSyntheticDataRoundTripsAndIsDeterministic) {
  fs::path dir = test::make_temp_dir("data-train");
  write_jsonl(dir / "train.jsonl", make_synthetic_records(1500, 3));

  testing::internal::CaptureStderr();
  train_tokenizer(dir / "train.jsonl", dir / "a.model", 400);
  train_tokenizer(dir / "train.jsonl", dir / "b.model", 400);
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_EQ(log, "") << "sentencepiece should train quietly";
  EXPECT_FALSE(fs::exists(dir / "a.model.tmp"));
  EXPECT_EQ(test::read_file(dir / "a.model"), test::read_file(dir / "b.model"));

  auto tok = load_tokenizer((dir / "a.model").string());
  EXPECT_EQ(tok->vocab_size(), 400);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  for (const std::string text :
       {"Reverse the letters of the word.", "SELECT COUNT(*) FROM employees WHERE city = 'Paris'",
        "12 + 34 = 46", "Z\xc3\xbcrich \xe2\x98\x83 unseen characters use byte fallback"}) {
    Ids ids = tok->encode(text);
    EXPECT_FALSE(ids.empty());
    for (int32_t id : ids) EXPECT_NE(id, 0) << "no <unk> with byte fallback: " << text;
    EXPECT_EQ(tok->decode(ids), text);
  }
  // Common words of the data became single pieces.
  EXPECT_LE(tok->encode("Reverse the letters of the word.").size(), 12u);
  EXPECT_EQ(tok->encode("the").size(), 1u);
  // Like Llama's, the trained model lets long texts be cut before encoding (docs/data.md).
  EXPECT_EQ(SentencePieceTokenizer(dir / "a.model").why_texts_are_not_cut(), "");

  // Plain text input works too.
  std::string text;
  for (int i = 0; i < 40; ++i)
    text += "the cat sat on the mat " + std::to_string(i) + "\nthe dog sat on the log\n";
  test::write_file(dir / "text.txt", text);
  train_tokenizer(dir / "text.txt", dir / "c.model", 300);
  auto small = load_tokenizer((dir / "c.model").string());
  EXPECT_EQ(small->decode(small->encode("the cat sat")), "the cat sat");
}

TEST(DataTokenizer, TrainErrors) {
  fs::path dir = test::make_temp_dir("data-train-err");
  EXPECT_EQ(error_of([&] { train_tokenizer(dir / "missing.txt", dir / "m.model", 300); }),
            "tokenizer training input '" + (dir / "missing.txt").string() + "' does not exist");
  test::write_file(dir / "empty.txt", "\n  \n");
  EXPECT_EQ(error_of([&] { train_tokenizer(dir / "empty.txt", dir / "m.model", 300); }),
            "tokenizer training input '" + (dir / "empty.txt").string() +
                "' is empty; expected text to learn a vocabulary from");
  test::write_file(dir / "tiny.txt", "abc abc abc\n");
  EXPECT_EQ(
      error_of([&] { train_tokenizer(dir / "tiny.txt", dir / "m.model", 5000); }),
      "cannot train a 5000-piece tokenizer on '" + (dir / "tiny.txt").string() +
          "' (1 sentences): Vocabulary size too high (5000). Please set it to a value <= 269.");
  EXPECT_EQ(
      error_of([&] { train_tokenizer(dir / "tiny.txt", dir / "m.model", 100); }),
      "tokenizer vocab_size 100 is too small; with byte fallback it must be at least 260 (256 "
      "byte pieces, <unk>, <s>, </s> and at least one learned piece)");
  EXPECT_FALSE(fs::exists(dir / "m.model"));
}

}  // namespace
}  // namespace fsdpq::data
