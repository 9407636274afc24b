#include "data/bpe_tokenizer.h"

#include <algorithm>

#include "data/byte_level.h"
#include "util/error.h"
#include "util/strings.h"

namespace fsdpq::data {

BpeTokenizer::BpeTokenizer(BpeModel model, PreTokenizer pre_tokenizer, Parts parts)
    : file_(std::move(parts.file)),
      kind_(std::move(parts.kind)),
      details_(std::move(parts.details)),
      model_(std::move(model)),
      pre_tokenizer_(std::move(pre_tokenizer)),
      added_(parts.added_tokens),
      token_text_(std::move(parts.token_text)),
      vocab_ids_(std::move(parts.vocab_ids)),
      template_prefix_(std::move(parts.template_prefix)),
      template_suffix_(std::move(parts.template_suffix)) {
  for (const AddedToken& t : parts.added_tokens) added_ids_.emplace(t.content, t.id);
  cut_at_word_ends_ = pre_tokenizer_.splits_as_llama3() &&
                      std::none_of(parts.added_tokens.begin(), parts.added_tokens.end(), [](const AddedToken& t) {
                        return t.content.find_first_of(" \t\r\n\f\v") != std::string::npos;
                      });
  // Hugging Face's ByteLevel decoder, applied to every token, added ones included.
  token_bytes_.reserve(token_text_.size());
  for (const std::string& text : token_text_) token_bytes_.push_back(byte_level::decode_token(text));
  for (const std::string& bytes : token_bytes_) max_token_bytes_ = std::max(max_token_bytes_, bytes.size());

  if (parts.bos_name) {
    bos_ = resolve(parts.bos_name, "bos_token", parts.names_source);
  } else if (!template_prefix_.empty()) {
    bos_ = template_prefix_.front();
  } else {
    fail("tokenizer '{}' names no BOS token ({}), and its post-processor puts none first; fsdpq "
         "needs one, as fsdp_qlora starts every example with BOS",
         file_.string(), parts.names_source);
  }
  if (!parts.eos_name)
    fail("tokenizer '{}' names no EOS token ({}); fsdpq needs one, as training ends every example "
         "with EOS: put a tokenizer_config.json with \"eos_token\" beside it",
         file_.string(), parts.names_source);
  eos_ = resolve(parts.eos_name, "eos_token", parts.names_source);
  pad_ = parts.pad_name ? resolve(parts.pad_name, "pad_token", parts.names_source) : eos_;
}

int32_t BpeTokenizer::resolve(const std::optional<std::string>& name, const char* role,
                              const std::string& names_source) const {
  if (std::optional<int32_t> id = id_of(*name)) return *id;
  fail("tokenizer '{}': {} '{}' ({}) is not a token of the tokenizer; expected one of its added "
       "tokens (such as <|end_of_text|>) or a vocabulary entry",
       file_.string(), role, *name, names_source);
}

std::optional<int32_t> BpeTokenizer::id_of(std::string_view token_text) const {
  const std::string key(token_text);
  if (auto it = added_ids_.find(key); it != added_ids_.end()) return it->second;
  if (auto it = vocab_ids_.find(key); it != vocab_ids_.end()) return it->second;
  return std::nullopt;
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  // Checked once here, so the regex engine need not check it on every search.
  if (!is_valid_utf8(text))
    fail("tokenizer '{}' cannot encode a text of {} bytes that is not valid UTF-8; expected UTF-8 "
         "text",
         file_.string(), text.size());
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  const PreTokenizer::Emit encode_piece = [&](std::string_view piece) { model_.encode_word(piece, ids); };
  added_.split(
      text, [&](std::string_view stretch) { pre_tokenizer_.split(stretch, encode_piece); },
      [&](int32_t id) { ids.push_back(id); });
  return ids;
}

size_t BpeTokenizer::cut_point(std::string_view text, size_t at) const {
  if (!cut_at_word_ends_) return text.size();
  auto is_letter = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); };
  for (size_t p = std::max<size_t>(at, 1); p < text.size(); ++p)
    if ((text[p] == ' ' || text[p] == '\n') && is_letter(text[p - 1])) return p;
  return text.size();
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  for (int32_t id : ids) {
    if (id == bos_ || id == eos_ || id == pad_ || id < 0 || id >= vocab_size()) continue;
    text += token_bytes_[id];
  }
  return text;
}

std::string BpeTokenizer::piece(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return "";
  return token_text_[id];
}

std::optional<int32_t> BpeTokenizer::template_bos_id() const {
  if (template_prefix_.empty()) return std::nullopt;
  return template_prefix_.front();
}

std::string BpeTokenizer::description() const {
  return fmt::format("{} {} (byte-level BPE, {} ids: {})", kind_, file_.string(), vocab_size(), details_);
}

}  // namespace fsdpq::data
