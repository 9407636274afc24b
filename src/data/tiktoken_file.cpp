#include "data/tiktoken_file.h"

#include <fstream>
#include <unordered_map>

#include "data/byte_level.h"
#include "data/tokenizer_config.h"
#include "util/error.h"
#include "util/strings.h"

namespace fsdpq::data {
namespace fs = std::filesystem;

namespace {

// Meta's 256 special tokens, numbered on from the last rank: the named ones of llama-models'
// llama3/tokenizer.py, then <|reserved_special_token_2|> onwards.
std::vector<std::string> llama3_special_tokens() {
  std::vector<std::string> tokens = {
      "<|begin_of_text|>", "<|end_of_text|>",   "<|reserved_special_token_0|>",
      "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>",
      "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>",
      "<|python_tag|>", "<|image|>"};
  constexpr size_t kCount = 256;
  for (size_t i = 2; tokens.size() < kCount; ++i) tokens.push_back(fmt::format("<|reserved_special_token_{}|>", i));
  return tokens;
}

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// Standard base64 with padding; nullopt when `text` is not that.
std::optional<std::string> decode_base64(std::string_view text) {
  if (text.empty() || text.size() % 4 != 0) return std::nullopt;
  size_t padding = 0;
  while (padding < 2 && text[text.size() - 1 - padding] == '=') ++padding;
  std::string out;
  uint32_t bits = 0;
  int bit_count = 0;
  for (size_t i = 0; i < text.size() - padding; ++i) {
    const int value = base64_value(text[i]);
    if (value < 0) return std::nullopt;
    bits = (bits << 6) | static_cast<uint32_t>(value);
    bit_count += 6;
    if (bit_count >= 8) {
      bit_count -= 8;
      out.push_back(static_cast<char>((bits >> bit_count) & 0xFF));
    }
  }
  return out;
}

struct Rank {
  std::string bytes;
  int32_t rank;
};

// A line's two fields (tiktoken splits on any whitespace); nullopt when there are not two.
std::optional<std::pair<std::string_view, std::string_view>> fields_of(std::string_view line) {
  std::vector<std::string_view> fields;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
    const size_t start = i;
    while (i < line.size() && !(line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
    if (i > start) fields.push_back(line.substr(start, i - start));
  }
  if (fields.size() != 2) return std::nullopt;
  return std::pair{fields[0], fields[1]};
}

std::vector<Rank> read_ranks(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) fail("cannot read tokenizer '{}'; check that it exists and is readable", file.string());
  std::vector<Rank> ranks;
  std::unordered_map<std::string, size_t> line_of_token;
  std::unordered_map<int32_t, size_t> line_of_rank;
  std::string line;
  for (size_t number = 1; std::getline(in, line); ++number) {
    if (trim(line).empty()) continue;
    const auto where = [&] { return fmt::format("tokenizer '{}' line {}", file.string(), number); };
    const auto fields = fields_of(line);
    if (!fields)
      fail("{}: expected a base64 token, a space and a rank (Meta's tiktoken format), found '{}'", where(),
           line.substr(0, 60));
    std::optional<std::string> bytes = decode_base64(fields->first);
    if (!bytes) fail("{}: the token '{}' is not base64", where(), fields->first);
    const std::optional<int64_t> rank = parse_int(fields->second);
    if (!rank || *rank < 0 || *rank >= (int64_t{1} << 31) - 256)
      fail("{}: the rank '{}' is not a non-negative integer below 2^31 - 256", where(), fields->second);
    const auto id = static_cast<int32_t>(*rank);
    if (auto [it, fresh] = line_of_token.emplace(*bytes, number); !fresh)
      fail("{}: the token '{}' is given again (first on line {})", where(), fields->first, it->second);
    if (auto [it, fresh] = line_of_rank.emplace(id, number); !fresh)
      fail("{}: the rank {} is given again (first on line {})", where(), id, it->second);
    ranks.push_back({std::move(*bytes), id});
  }
  if (ranks.empty()) fail("tokenizer '{}' holds no tokens; expected Meta's tiktoken tokenizer.model", file.string());
  return ranks;
}

// tiktoken merges the adjacent pair whose concatenation has the lowest rank: as BPE merges, every
// split of a token into two tokens, ranked by the token's own rank.
std::vector<BpeModel::Merge> merges_of(const std::vector<Rank>& ranks) {
  std::unordered_map<std::string_view, int32_t> rank_of;
  rank_of.reserve(ranks.size());
  for (const Rank& r : ranks) rank_of.emplace(r.bytes, r.rank);
  std::vector<BpeModel::Merge> merges;
  for (const Rank& r : ranks) {
    const std::string_view token = r.bytes;
    for (size_t cut = 1; cut < token.size(); ++cut) {
      auto left = rank_of.find(token.substr(0, cut));
      auto right = rank_of.find(token.substr(cut));
      if (left != rank_of.end() && right != rank_of.end())
        merges.push_back({left->second, right->second, r.rank, static_cast<uint32_t>(r.rank)});
    }
  }
  return merges;
}

}  // namespace

bool looks_like_tiktoken(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::string line;
  if (!in || !std::getline(in, line) || line.size() > 4096) return false;
  const auto fields = fields_of(line);
  return fields && decode_base64(fields->first) && parse_int(fields->second);
}

std::unique_ptr<BpeTokenizer> load_tiktoken_file(const fs::path& file) {
  std::vector<Rank> ranks = read_ranks(file);
  const auto base_count = static_cast<int32_t>(ranks.size());
  BpeTokenizer::Parts parts;
  parts.file = file;
  parts.kind = "tiktoken";
  parts.token_text.resize(base_count);
  std::array<BpeModel::ByteSymbol, 256> byte_symbols;
  for (const Rank& r : ranks) {
    // Meta numbers the special tokens on from the number of ranks: the ranks must sit below it.
    if (r.rank >= base_count)
      fail("tokenizer '{}': rank {} is not below the number of tokens ({}); Meta's tiktoken files "
           "number their tokens 0 to {} and the special tokens from {}",
           file.string(), r.rank, base_count, base_count - 1, base_count);
    std::string text;
    for (char c : r.bytes) text += byte_level::char_of_byte(static_cast<uint8_t>(c));
    parts.vocab_ids.emplace(text, r.rank);
    parts.token_text[r.rank] = std::move(text);
    if (r.bytes.size() == 1) byte_symbols[static_cast<unsigned char>(r.bytes[0])].ids = {r.rank};
  }
  for (int b = 0; b < 256; ++b)
    if (byte_symbols[b].ids.empty())
      fail("tokenizer '{}' has no token for the byte 0x{:02X}; a byte-level BPE file has all 256 "
           "single bytes",
           file.string(), b);

  for (const std::string& name : llama3_special_tokens()) {
    const auto id = static_cast<int32_t>(parts.token_text.size());
    parts.added_tokens.push_back({.content = name, .id = id, .normalized = false, .special = true});
    parts.token_text.push_back(name);
  }
  parts.template_prefix = {base_count};  // Meta's encode(bos=True): <|begin_of_text|> first

  const std::vector<BpeModel::Merge> merges = merges_of(ranks);
  std::vector<std::pair<std::string, int32_t>> tokens;
  tokens.reserve(ranks.size());
  for (Rank& r : ranks) tokens.emplace_back(std::move(r.bytes), r.rank);
  BpeModel::Options options;
  options.ignore_merges = true;  // tiktoken looks a whole piece up before merging
  BpeModel model(std::move(tokens), std::move(byte_symbols), merges, options);

  std::vector<PreTokenizer::Step> steps;
  steps.emplace_back(PreTokenizer::Split{
      std::make_unique<UnicodeRegex>(kLlama3SplitPattern, false, "Meta's Llama-3 split pattern"),
      SplitBehavior::Isolated, false, std::string(kLlama3SplitPattern)});

  parts.details = fmt::format("{} ranks + {} Llama-3 special tokens", base_count, parts.added_tokens.size());
  const SpecialTokenNames names = read_special_token_names(file);
  parts.bos_name = names.bos.value_or("<|begin_of_text|>");
  parts.eos_name = names.eos.value_or("<|end_of_text|>");
  parts.pad_name = names.pad;
  parts.names_source = names.bos || names.eos ? names.source : "Meta's Llama-3 tokenizer.py";
  return std::make_unique<BpeTokenizer>(std::move(model), PreTokenizer(std::move(steps)), std::move(parts));
}

}  // namespace fsdpq::data
