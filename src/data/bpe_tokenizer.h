// A byte-level BPE tokenizer (Llama-3 / 3.1 / 3.2, GPT-2, and any tokenizer.json of that kind, or
// Meta's tiktoken tokenizer.model) giving exactly Hugging Face's ids:
//   text → added tokens split out (added_tokens.h) → each stretch between them pre-tokenized
//   (pre_tokenizer.h) → each pre-token merged by the BPE model (bpe_model.h).
// The loaders (hf_tokenizer_json.h, tiktoken_file.h) read the files into its Parts.
#pragma once
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/added_tokens.h"
#include "data/bpe_model.h"
#include "data/pre_tokenizer.h"
#include "data/tokenizer.h"

namespace fsdpq::data {

class BpeTokenizer final : public Tokenizer {
 public:
  struct Parts {
    std::filesystem::path file;
    std::string kind;     // "tokenizer.json" or "tiktoken", for description()
    std::string details;  // what description() says of the vocabulary after the id count
    std::vector<AddedToken> added_tokens;
    // Each token as the file writes it ("Ġworld"; added tokens as their content), by id; "" where
    // no token has the id.
    std::vector<std::string> token_text;
    // Each token's text as written as a vocabulary entry (not added tokens) → id.
    std::unordered_map<std::string, int32_t> vocab_ids;
    // What Hugging Face's encode(text) puts before / after the ids (the post-processor's template).
    std::vector<int32_t> template_prefix, template_suffix;
    // The special tokens by name; bos defaults to the template's first id, pad to eos.
    std::optional<std::string> bos_name, eos_name, pad_name;
    std::string names_source;  // where the names come from, for errors
  };

  BpeTokenizer(BpeModel model, PreTokenizer pre_tokenizer, Parts parts);

  std::vector<int32_t> encode(std::string_view text) const override;
  // The tokens' bytes joined; BOS, EOS, padding and unknown ids add nothing. Added tokens write
  // their content. A cut through a multi-byte character leaves its bytes as they are, as
  // tiktoken's decode_bytes (Hugging Face would write U+FFFD).
  std::string decode(const std::vector<int32_t>& ids) const override;
  std::string piece(int32_t id) const override;
  int32_t bos_id() const override { return bos_; }
  int32_t eos_id() const override { return eos_; }
  int32_t pad_id() const override { return pad_; }
  int64_t vocab_size() const override { return static_cast<int64_t>(token_text_.size()); }
  std::string description() const override;
  std::optional<int32_t> template_bos_id() const override;
  // Llama-3's pre-tokenizer (PreTokenizer::splits_as_llama3) with no added token holding
  // whitespace: the end of a word (an ASCII letter, then a space or a newline) is a boundary of
  // every pre-token and added-token match, so a text cut there encodes to exactly the first ids of
  // the whole. Other tokenizers are never cut.
  size_t cut_point(std::string_view text, size_t at) const override;
  size_t max_token_bytes() const override { return max_token_bytes_; }

  const std::vector<int32_t>& template_prefix() const { return template_prefix_; }
  const std::vector<int32_t>& template_suffix() const { return template_suffix_; }
  // The id of a token by its text as the file writes it (added tokens first), if any.
  std::optional<int32_t> id_of(std::string_view token_text) const;

 private:
  int32_t resolve(const std::optional<std::string>& name, const char* role,
                  const std::string& names_source) const;

  std::filesystem::path file_;
  std::string kind_, details_;
  BpeModel model_;
  PreTokenizer pre_tokenizer_;
  AddedTokenMatcher added_;
  std::unordered_map<std::string, int32_t> added_ids_;
  std::vector<std::string> token_text_;
  std::vector<std::string> token_bytes_;  // what decode writes for each id
  std::unordered_map<std::string, int32_t> vocab_ids_;
  std::vector<int32_t> template_prefix_, template_suffix_;
  int32_t bos_ = -1, eos_ = -1, pad_ = -1;
  bool cut_at_word_ends_ = false;
  size_t max_token_bytes_ = 0;  // the longest token's bytes
};

}  // namespace fsdpq::data
