// Tokenizers: the Llama sentencepiece model, byte-level BPE (Llama-3: bpe_tokenizer.h), a
// byte-level stand-in for benchmarks, and training a small sentencepiece model for demos.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fsdpq::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Token ids of `text`, with no BOS or EOS (callers add them, as fsdp_qlora's dataset does).
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // Text of `ids`; BOS, EOS, padding and unknown ids add nothing.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  // The token `id` as the tokenizer file writes it ("▁Hello", "Ġworld", "<|eot_id|>"); "" for an
  // unknown id.
  virtual std::string piece(int32_t id) const = 0;
  virtual int32_t bos_id() const = 0;
  virtual int32_t eos_id() const = 0;
  // fsdp_qlora sets tokenizer.pad_token_id = tokenizer.eos_token_id.
  virtual int32_t pad_id() const { return eos_id(); }
  virtual int64_t vocab_size() const = 0;
  // One line for logs, e.g. "sentencepiece /data/tokenizer.model (32000 pieces)".
  virtual std::string description() const = 0;
  // The id that Hugging Face's encode(text) puts first by the tokenizer file's post-processor
  // (Llama-3's tokenizer.json: <|begin_of_text|>); nullopt when the file has no such template.
  virtual std::optional<int32_t> template_bos_id() const { return std::nullopt; }

  // For encoding only the start of a long text (encode_leading): a position p >= at where the text
  // may be cut, such that encode(text[0, p)) is exactly the first ids of encode(text); text.size()
  // when there is none at or after `at`, or the tokenizer cannot tell (then it is never cut).
  virtual size_t cut_point(std::string_view text, size_t at) const {
    (void)at;
    return text.size();
  }
  // The most bytes of text one token stands for: n tokens never cover more than n times this.
  virtual size_t max_token_bytes() const { return 0; }
};

// Loads a sentencepiece tokenizer.model. Encodes like Hugging Face's LlamaTokenizer (legacy):
// encode(text) = sp.EncodeAsIds(text); the dataset prepends BOS.
class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::filesystem::path& model_file);
  ~SentencePieceTokenizer() override;

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  std::string piece(int32_t id) const override;
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_id_; }
  int64_t vocab_size() const override { return vocab_size_; }
  std::string description() const override;
  // Just before a space that follows a non-space, for the models where that is exact
  // (data/sentencepiece_cuts.h; Llama's is one); never for the others.
  size_t cut_point(std::string_view text, size_t at) const override;
  size_t max_token_bytes() const override;
  // Why this model's texts are never cut ("" when they may be).
  const std::string& why_texts_are_not_cut() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::filesystem::path path_;
  int32_t bos_id_ = 1, eos_id_ = 2;
  int64_t vocab_size_ = 0;
};

// "builtin:bytes": 0 <unk>, 1 <s>, 2 </s>, 3..258 = the 256 byte values. Needs no file, so
// benchmarks run on machines without a tokenizer.model.
class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int32_t kUnk = 0, kBos = 1, kEos = 2, kFirstByte = 3;

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  std::string piece(int32_t id) const override;  // "<s>", "<0x41>"
  int32_t bos_id() const override { return kBos; }
  int32_t eos_id() const override { return kEos; }
  int64_t vocab_size() const override { return kFirstByte + 256; }
  std::string description() const override;
  // One token per byte: any position is exact.
  size_t cut_point(std::string_view text, size_t at) const override { return std::min(at, text.size()); }
  size_t max_token_bytes() const override { return 1; }
};

// `spec` is "builtin:bytes", a tokenizer file, or a model folder. A file is read by its content:
// a sentencepiece model (protobuf), a Hugging Face tokenizer.json, or Meta's tiktoken
// tokenizer.model (lines of base64 token and rank). In a folder the first of these is used: a
// sentencepiece tokenizer.model (Llama-2, Mistral), tokenizer.json (with tokenizer_config.json
// beside it), a tiktoken tokenizer.model.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec);

// Whether `file` is JSON (a Hugging Face tokenizer.json), whatever its name: an object after any
// whitespace and a UTF-8 byte order mark.
bool is_json_tokenizer_file(const std::filesystem::path& file);

// Whether `folder` holds a tokenizer file load_tokenizer(folder) would read.
bool folder_has_tokenizer(const std::filesystem::path& folder);

// Trains a Llama-like sentencepiece model (BPE, byte fallback, digits split, unk 0 / bos 1 /
// eos 2, no pad piece) on `input`: a text file (one sentence a line) or a .json / .jsonl file of
// records whose string values are the sentences. Deterministic and quiet; `output_model` is
// written atomically.
void train_tokenizer(const std::filesystem::path& input, const std::filesystem::path& output_model,
                     int vocab_size);

}  // namespace fsdpq::data
