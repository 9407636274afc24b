#include "data/tokenizer.h"

#include <cerrno>
#include <cstring>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cctype>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "data/hf_tokenizer_json.h"
#include "data/records.h"
#include "data/tiktoken_file.h"
#include "data/sentencepiece_cuts.h"
#include "data/sentencepiece_spec.h"
#include "util/error.h"
#include "util/strings.h"
#include "util/write_via_temp.h"

namespace fsdpq::data {
namespace fs = std::filesystem;

namespace {

// sentencepiece statuses read "Internal: ./src/x.cc(660) [cond] Actual message"; keep the message
// (which may be empty: a failed check alone says nothing useful to a user).
std::string status_message(const sentencepiece::util::Status& status) {
  std::string text = status.ToString();
  if (size_t close = text.find("] "); close != std::string::npos) text = text.substr(close + 2);
  return std::string(trim(text));
}

}  // namespace

// ---- SentencePieceTokenizer ------------------------------------------------------------------

struct SentencePieceTokenizer::Impl {
  sentencepiece::SentencePieceProcessor processor;
  SentencePieceCuts cuts;
};

SentencePieceTokenizer::SentencePieceTokenizer(const fs::path& model_file)
    : impl_(std::make_unique<Impl>()), path_(model_file) {
  std::error_code ec;
  if (!fs::exists(model_file, ec))
    fail("tokenizer '{}' does not exist; expected a sentencepiece tokenizer.model file",
         model_file.string());
  if (!fs::is_regular_file(model_file, ec))
    fail("tokenizer '{}' is not a file; expected a sentencepiece tokenizer.model file",
         model_file.string());
  auto status = impl_->processor.Load(model_file.string());
  if (!status.ok()) {
    std::string why = status_message(status);
    fail(
        "tokenizer '{}' is not a sentencepiece model{}; expected a tokenizer.model such as the "
        "one in a Llama model folder",
        model_file.string(), why.empty() ? "" : " (" + why + ")");
  }
  bos_id_ = impl_->processor.bos_id();
  eos_id_ = impl_->processor.eos_id();
  vocab_size_ = impl_->processor.GetPieceSize();
  // Training appends EOS and fsdp_qlora prepends BOS: a model without them cannot be used.
  if (bos_id_ < 0 || eos_id_ < 0)
    fail("tokenizer '{}' has no {} piece; fsdpq needs both <s> (BOS) and </s> (EOS)",
         model_file.string(), bos_id_ < 0 ? "BOS" : "EOS");
  std::vector<std::string> pieces;
  pieces.reserve(static_cast<size_t>(vocab_size_));
  for (int id = 0; id < vocab_size_; ++id) pieces.push_back(impl_->processor.IdToPiece(id));
  impl_->cuts = sentencepiece_cuts(
      read_sentencepiece_spec(impl_->processor.serialized_model_proto(), model_file.string()), pieces);
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::vector<int32_t> SentencePieceTokenizer::encode(std::string_view text) const {
  std::vector<int> ids;
  auto status = impl_->processor.Encode(text, &ids);
  if (!status.ok())
    fail("tokenizer '{}' could not encode a text of {} bytes: {}", path_.string(), text.size(),
         status_message(status));
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::string SentencePieceTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::vector<int> in;
  in.reserve(ids.size());
  // sentencepiece rejects out-of-range ids; drop them as the interface promises.
  for (int32_t id : ids)
    if (id >= 0 && id < vocab_size_) in.push_back(id);
  std::string text;
  auto status = impl_->processor.Decode(in, &text);
  if (!status.ok())
    fail("tokenizer '{}' could not decode {} ids: {}", path_.string(), ids.size(),
         status_message(status));
  return text;
}

std::string SentencePieceTokenizer::piece(int32_t id) const {
  if (id < 0 || id >= vocab_size_) return "";
  return impl_->processor.IdToPiece(id);
}

size_t SentencePieceTokenizer::cut_point(std::string_view text, size_t at) const {
  return impl_->cuts.allowed ? cut_before_space(text, at) : text.size();
}

size_t SentencePieceTokenizer::max_token_bytes() const { return impl_->cuts.max_token_bytes; }

const std::string& SentencePieceTokenizer::why_texts_are_not_cut() const { return impl_->cuts.why_not; }

std::string SentencePieceTokenizer::description() const {
  return fmt::format("sentencepiece {} ({} pieces)", path_.string(), vocab_size_);
}

// ---- ByteTokenizer ---------------------------------------------------------------------------

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (char c : text) ids.push_back(kFirstByte + static_cast<unsigned char>(c));
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  text.reserve(ids.size());
  for (int32_t id : ids)
    if (id >= kFirstByte && id < kFirstByte + 256)
      text.push_back(static_cast<char>(id - kFirstByte));
  return text;
}

std::string ByteTokenizer::piece(int32_t id) const {
  if (id == kUnk) return "<unk>";
  if (id == kBos) return "<s>";
  if (id == kEos) return "</s>";
  if (id >= kFirstByte && id < kFirstByte + 256) return fmt::format("<0x{:02X}>", id - kFirstByte);
  return "";
}

std::string ByteTokenizer::description() const {
  return "builtin:bytes (259 ids: <unk>, <s>, </s> and the 256 byte values)";
}

// ---- load_tokenizer --------------------------------------------------------------------------

// An object after any whitespace (and a UTF-8 byte order mark, which the JSON reader skips too).
bool is_json_tokenizer_file(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  char head[3] = {};
  in.read(head, 3);
  if (std::string_view(head, in.gcount()) != "\xEF\xBB\xBF") {
    in.clear();  // a file shorter than 3 bytes ended the read
    in.seekg(0);
  }
  char c = 0;
  while (in.get(c))
    if (!std::isspace(static_cast<unsigned char>(c))) return c == '{';
  return false;
}

namespace {

// A tokenizer file, read by what it holds rather than by its name.
std::unique_ptr<Tokenizer> load_tokenizer_file(const fs::path& file) {
  std::error_code ec;
  if (!fs::exists(file, ec))
    fail("tokenizer '{}' does not exist; expected a tokenizer.model, a tokenizer.json or a model "
         "folder holding one",
         file.string());
  if (is_json_tokenizer_file(file)) return load_hf_tokenizer_json(file);
  if (looks_like_tiktoken(file)) return load_tiktoken_file(file);
  return std::make_unique<SentencePieceTokenizer>(file);
}

}  // namespace

bool folder_has_tokenizer(const fs::path& folder) {
  std::error_code ec;
  return fs::is_regular_file(folder / "tokenizer.model", ec) || fs::is_regular_file(folder / "tokenizer.json", ec);
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec) {
  if (trim(spec).empty())
    fail(
        "tokenizer is empty; expected a tokenizer.model or tokenizer.json path, a model folder "
        "holding one, or builtin:bytes");
  if (starts_with(spec, "builtin:")) {
    if (spec == "builtin:bytes") return std::make_unique<ByteTokenizer>();
    fail("unknown built-in tokenizer '{}'; the only built-in tokenizer is builtin:bytes", spec);
  }
  const fs::path path(spec);
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return load_tokenizer_file(path);
  // A folder may hold several: sentencepiece is exact for Llama-2 / Mistral, tokenizer.json comes
  // with the special-token names of tokenizer_config.json, tiktoken is the last resort.
  const fs::path model = path / "tokenizer.model", json = path / "tokenizer.json";
  const bool has_model = fs::is_regular_file(model, ec), has_json = fs::is_regular_file(json, ec);
  if (has_model && !looks_like_tiktoken(model)) return std::make_unique<SentencePieceTokenizer>(model);
  if (has_json) return load_hf_tokenizer_json(json);
  if (has_model) return load_tiktoken_file(model);
  fail("tokenizer folder '{}' has neither tokenizer.model nor tokenizer.json; expected a "
       "sentencepiece or tiktoken tokenizer.model, or a Hugging Face tokenizer.json",
       path.string());
}

// ---- train_tokenizer -------------------------------------------------------------------------

namespace {

class VectorSentences final : public sentencepiece::SentenceIterator {
 public:
  explicit VectorSentences(const std::vector<std::string>& sentences) : sentences_(sentences) {}
  bool done() const override { return index_ >= sentences_.size(); }
  void Next() override { ++index_; }
  const std::string& value() const override { return sentences_[index_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& sentences_;
  size_t index_ = 0;
};

bool is_json_input(const fs::path& input) {
  std::string ext = to_lower(input.extension().string());
  return ext == ".jsonl" || ext == ".json";
}

std::vector<std::string> training_sentences(const fs::path& input) {
  std::vector<std::string> sentences;
  if (is_json_input(input)) {
    ReadStats stats;
    for (const Record& record : read_records(input, {}, false, &stats))
      for (const auto& [key, value] : record.fields)
        if (!value.empty()) sentences.push_back(value);
    return sentences;
  }
  std::error_code ec;
  if (!fs::exists(input, ec)) fail("tokenizer training input '{}' does not exist", input.string());
  std::ifstream in(input, std::ios::binary);
  if (!in || fs::is_directory(input, ec))
    fail("cannot read tokenizer training input '{}': {}; expected a readable text file", input.string(),
         fs::is_directory(input, ec) ? "it is a directory" : std::strerror(errno));
  std::string line;
  size_t line_number = 0;
  while (std::getline(in, line)) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!is_valid_utf8(line))
      fail("{}:{}: the line is not valid UTF-8; expected UTF-8 text", input.string(), line_number);
    if (!trim(line).empty()) sentences.push_back(line);
  }
  return sentences;
}

}  // namespace

void train_tokenizer(const fs::path& input, const fs::path& output_model, int vocab_size) {
  // 256 byte pieces + unk/bos/eos come first with byte_fallback; below that nothing is learned.
  constexpr int kMinVocab = 256 + 3 + 1;
  if (vocab_size < kMinVocab)
    fail(
        "tokenizer vocab_size {} is too small; with byte fallback it must be at least {} "
        "(256 byte pieces, <unk>, <s>, </s> and at least one learned piece)",
        vocab_size, kMinVocab);
  std::vector<std::string> sentences = training_sentences(input);
  if (sentences.empty())
    fail("tokenizer training input '{}' is empty; expected text to learn a vocabulary from",
         input.string());

  // Llama-2's own trainer settings where they matter for encoding; minloglevel=2 keeps
  // sentencepiece's progress log off stderr; one thread keeps the result deterministic.
  const std::unordered_map<std::string, std::string> options = {
      {"model_prefix", ""},
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(vocab_size)},
      {"byte_fallback", "true"},
      {"split_digits", "true"},
      {"allow_whitespace_only_pieces", "true"},
      {"remove_extra_whitespaces", "false"},
      {"normalization_rule_name", "identity"},
      {"character_coverage", "0.99995"},
      {"max_sentence_length", "1000000"},
      {"input_sentence_size", "0"},
      {"shuffle_input_sentence", "false"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      {"num_threads", "1"},
      {"minloglevel", "2"},
  };
  VectorSentences iterator(sentences);
  std::string model_proto;
  auto status = sentencepiece::SentencePieceTrainer::Train(options, &iterator, &model_proto);
  if (!status.ok())
    fail("cannot train a {}-piece tokenizer on '{}' ({} sentences): {}", vocab_size, input.string(),
         sentences.size(), status_message(status));
  write_via_temp(
      output_model,
      [&](std::ostream& out) { out.write(model_proto.data(), static_cast<std::streamsize>(model_proto.size())); },
      "the trained tokenizer");
}

}  // namespace fsdpq::data
