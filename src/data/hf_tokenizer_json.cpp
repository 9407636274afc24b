#include "data/hf_tokenizer_json.h"

#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "data/byte_level.h"
#include "data/tokenizer_config.h"
#include "util/error.h"
#include "util/strings.h"

namespace fsdpq::data {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The reader of one file: every error names it.
class TokenizerJson {
 public:
  explicit TokenizerJson(const fs::path& file) : file_(file) {}

  template <class... Args>
  [[noreturn]] void bad(fmt::format_string<Args...> format, Args&&... args) const {
    fail("tokenizer '{}': {}", file_.string(), fmt::format(format, std::forward<Args>(args)...));
  }

  json parse() const;
  const json& bpe_model(const json& root) const;
  void check_normalizer(const json& root) const;
  void read_vocab(const json& model, BpeTokenizer::Parts& parts) const;
  std::vector<BpeModel::Merge> read_merges(const json& model, const BpeTokenizer::Parts& parts) const;
  BpeModel::Options read_model_options(const json& model, const BpeTokenizer::Parts& parts) const;
  std::array<BpeModel::ByteSymbol, 256> byte_symbols(const json& model,
                                                     const BpeTokenizer::Parts& parts) const;
  std::vector<AddedToken> read_added_tokens(const json& root, const BpeTokenizer::Parts& parts) const;
  PreTokenizer read_pre_tokenizer(const json& root) const;
  void check_decoder(const json& root) const;
  void read_post_processor(const json& processor, BpeTokenizer::Parts& parts) const;

 private:
  void add_pre_tokenizer_steps(const json& node, std::vector<PreTokenizer::Step>& steps) const;
  PreTokenizer::Split read_split(const json& node) const;
  void read_template(const json& node, BpeTokenizer::Parts& parts) const;
  bool flag(const json& node, const char* key, bool fallback, const std::string& where) const;
  std::string type_of(const json& node, const std::string& where) const;

  fs::path file_;
};

json TokenizerJson::parse() const {
  std::ifstream in(file_, std::ios::binary);
  if (!in) fail("cannot read tokenizer '{}'; check that it exists and is readable", file_.string());
  std::stringstream text;
  text << in.rdbuf();
  try {
    json root = json::parse(text.str());
    if (!root.is_object()) bad("the file is JSON but not an object; expected a Hugging Face tokenizer.json");
    return root;
  } catch (const json::parse_error& e) {
    // "[json.exception.parse_error.101] parse error at line 1, column 9: ..." → from "parse error".
    std::string why = e.what();
    if (size_t at = why.find("] "); at != std::string::npos) why = why.substr(at + 2);
    bad("not valid JSON ({}); expected a Hugging Face tokenizer.json", why);
  }
}

std::string TokenizerJson::type_of(const json& node, const std::string& where) const {
  if (!node.is_object() || !node.contains("type") || !node["type"].is_string())
    bad("{} is {}; expected an object with a \"type\"", where, node.dump().substr(0, 80));
  return node["type"].get<std::string>();
}

bool TokenizerJson::flag(const json& node, const char* key, bool fallback, const std::string& where) const {
  auto it = node.find(key);
  if (it == node.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) bad("{}: \"{}\" is {}; expected true or false", where, key, it->dump());
  return it->get<bool>();
}

const json& TokenizerJson::bpe_model(const json& root) const {
  if (!root.contains("model") || !root["model"].is_object())
    bad("no \"model\" object; expected a Hugging Face tokenizer.json");
  const json& model = root["model"];
  // Old files leave out "type"; a BPE model is the one with merges.
  const bool typed = model.contains("type");
  const std::string type = typed ? type_of(model, "\"model\"") : "BPE";
  if (type != "BPE" || (!typed && !model.contains("merges")))
    bad("model type {} is not supported; fsdpq reads byte-level BPE tokenizers (model type BPE, as "
        "Llama-3, GPT-2 and Qwen ship)",
        typed ? "'" + type + "'" : "(none given, and no merges)");
  for (const char* key : {"vocab", "merges"})
    if (!model.contains(key)) bad("the BPE model has no \"{}\"", key);
  if (!model["vocab"].is_object()) bad("the BPE model's \"vocab\" is not an object of token → id");
  if (!model["merges"].is_array()) bad("the BPE model's \"merges\" is not a list");
  return model;
}

void TokenizerJson::check_normalizer(const json& root) const {
  auto it = root.find("normalizer");
  if (it == root.end() || it->is_null()) return;
  bad("normalizer '{}' is not supported; fsdpq reads byte-level tokenizers without a normalizer "
      "(\"normalizer\": null, as Llama-3's)",
      it->is_object() && it->contains("type") ? (*it)["type"].dump() : it->dump());
}

void TokenizerJson::read_vocab(const json& model, BpeTokenizer::Parts& parts) const {
  std::vector<std::pair<std::string, int32_t>> encodable;
  parts.vocab_ids.reserve(model["vocab"].size());
  for (const auto& [token, value] : model["vocab"].items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() >= std::numeric_limits<int32_t>::max())
      bad("vocab entry \"{}\" has id {}; expected a non-negative integer below 2^31", token, value.dump());
    const auto id = static_cast<int32_t>(value.get<int64_t>());
    parts.vocab_ids.emplace(token, id);
    if (parts.token_text.size() <= static_cast<size_t>(id)) parts.token_text.resize(id + 1);
    if (parts.token_text[id].empty()) parts.token_text[id] = token;
  }
}

std::vector<BpeModel::Merge> TokenizerJson::read_merges(const json& model,
                                                       const BpeTokenizer::Parts& parts) const {
  const auto id_of = [&](const std::string& token, size_t index, const std::string& entry) {
    auto it = parts.vocab_ids.find(token);
    if (it == parts.vocab_ids.end())
      bad("merges entry {} ({}) names \"{}\", which is not in the vocab; every merge must join two "
          "vocab tokens into a third",
          index, entry, token);
    return it->second;
  };
  std::vector<BpeModel::Merge> merges;
  merges.reserve(model["merges"].size());
  size_t index = 0;  // 1-based position in the list, as errors count
  uint32_t rank = 0;
  for (const json& entry : model["merges"]) {
    ++index;
    std::string left, right;
    if (entry.is_string()) {
      // The older "a b" form; Hugging Face skips "#version" lines and counts ranks without them.
      const std::string line = entry.get<std::string>();
      if (starts_with(line, "#version")) continue;
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos)
        bad("merges entry {} ({}) is not two tokens separated by one space", index, entry.dump());
      left = line.substr(0, space);
      right = line.substr(space + 1);
    } else if (entry.is_array() && entry.size() == 2 && entry[0].is_string() && entry[1].is_string()) {
      left = entry[0].get<std::string>();
      right = entry[1].get<std::string>();
    } else {
      bad("merges entry {} is {}; expected \"a b\" or [\"a\", \"b\"]", index, entry.dump().substr(0, 80));
    }
    const std::string text = entry.dump();
    merges.push_back(
        {id_of(left, index, text), id_of(right, index, text), id_of(left + right, index, text), rank++});
  }
  return merges;
}

BpeModel::Options TokenizerJson::read_model_options(const json& model,
                                                    const BpeTokenizer::Parts& parts) const {
  if (auto it = model.find("dropout"); it != model.end() && !it->is_null() &&
                                       !(it->is_number() && it->get<double>() == 0.0))
    bad("BPE dropout {} is not supported; fsdpq encodes deterministically (\"dropout\": null)", it->dump());
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (auto it = model.find(key); it != model.end() && !it->is_null() &&
                                   !(it->is_string() && it->get<std::string>().empty()))
      bad("the BPE model's \"{}\" {} is not supported; byte-level tokenizers have none (null)", key, it->dump());
  BpeModel::Options options;
  options.ignore_merges = flag(model, "ignore_merges", false, "the BPE model");
  options.fuse_unk = flag(model, "fuse_unk", false, "the BPE model");
  if (auto it = model.find("unk_token"); it != model.end() && !it->is_null()) {
    if (!it->is_string()) bad("the BPE model's \"unk_token\" is {}; expected a token or null", it->dump());
    auto unk = parts.vocab_ids.find(it->get<std::string>());
    if (unk == parts.vocab_ids.end())
      bad("the BPE model's unk_token \"{}\" is not in the vocab", it->get<std::string>());
    options.unk_id = unk->second;
  }
  return options;
}

std::array<BpeModel::ByteSymbol, 256> TokenizerJson::byte_symbols(const json& model,
                                                                  const BpeTokenizer::Parts& parts) const {
  const bool byte_fallback = flag(model, "byte_fallback", false, "the BPE model");
  std::array<BpeModel::ByteSymbol, 256> symbols;
  for (int b = 0; b < 256; ++b) {
    // The model sees a byte as its byte-level character, and looks that character up.
    const std::string& character = byte_level::char_of_byte(static_cast<uint8_t>(b));
    if (auto it = parts.vocab_ids.find(character); it != parts.vocab_ids.end()) {
      symbols[b].ids = {it->second};
      continue;
    }
    if (!byte_fallback) continue;
    // Byte fallback spells the character's UTF-8 bytes as <0xXX> tokens, when all of them exist.
    std::vector<int32_t> ids;
    for (unsigned char byte : character) {
      auto it = parts.vocab_ids.find(fmt::format("<0x{:02X}>", byte));
      if (it == parts.vocab_ids.end()) break;
      ids.push_back(it->second);
    }
    if (ids.size() == character.size()) symbols[b] = {ids, true};
  }
  return symbols;
}

// Hugging Face's AddedVocabulary::add_tokens: a token keeps the id its content already has (an
// earlier added token, then the vocab); the others are numbered on from the vocab's size. The ids
// written in the file are not used (Hugging Face only warns when they differ).
std::vector<AddedToken> TokenizerJson::read_added_tokens(const json& root,
                                                         const BpeTokenizer::Parts& parts) const {
  std::vector<AddedToken> tokens;
  auto list = root.find("added_tokens");
  if (list == root.end() || list->is_null()) return tokens;
  if (!list->is_array()) bad("\"added_tokens\" is not a list");
  std::unordered_map<std::string, size_t> index_of_content;
  std::unordered_map<int32_t, size_t> index_of_id;
  int32_t next_id = static_cast<int32_t>(parts.vocab_ids.size());
  size_t position = 0;
  for (const json& entry : *list) {
    ++position;
    const std::string where = fmt::format("added_tokens entry {}", position);
    if (!entry.is_object() || !entry.contains("content") || !entry["content"].is_string())
      bad("{} has no \"content\" string", where);
    AddedToken token;
    token.content = entry["content"].get<std::string>();
    token.single_word = flag(entry, "single_word", false, where);
    token.lstrip = flag(entry, "lstrip", false, where);
    token.rstrip = flag(entry, "rstrip", false, where);
    token.normalized = flag(entry, "normalized", true, where);
    token.special = flag(entry, "special", false, where);
    if (token.content.empty()) continue;
    if (auto known = index_of_content.find(token.content); known != index_of_content.end()) {
      token.id = tokens[known->second].id;
    } else if (auto in_vocab = parts.vocab_ids.find(token.content); in_vocab != parts.vocab_ids.end()) {
      token.id = in_vocab->second;
    } else {
      token.id = next_id++;
    }
    index_of_content[token.content] = tokens.size();
    // A later token with the same id replaces the earlier one.
    if (auto same_id = index_of_id.find(token.id); same_id != index_of_id.end()) {
      tokens[same_id->second] = token;
      index_of_content[token.content] = same_id->second;
    } else {
      index_of_id[token.id] = tokens.size();
      tokens.push_back(token);
    }
  }
  return tokens;
}

PreTokenizer::Split TokenizerJson::read_split(const json& node) const {
  PreTokenizer::Split split;
  const json& pattern = node.contains("pattern") ? node["pattern"] : json();
  const bool is_regex = pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string();
  const bool is_string = pattern.is_object() && pattern.contains("String") && pattern["String"].is_string();
  if (!is_regex && !is_string)
    bad("a Split pre-tokenizer's pattern is {}; expected {{\"Regex\": \"...\"}} or {{\"String\": \"...\"}}",
        pattern.dump().substr(0, 80));
  split.pattern = std::make_unique<UnicodeRegex>(
      is_regex ? pattern["Regex"].get<std::string>() : pattern["String"].get<std::string>(), is_string,
      fmt::format("tokenizer '{}': pre_tokenizer Split", file_.string()));
  static const std::pair<const char*, SplitBehavior> kBehaviors[] = {
      {"Removed", SplitBehavior::Removed},
      {"Isolated", SplitBehavior::Isolated},
      {"MergedWithPrevious", SplitBehavior::MergedWithPrevious},
      {"MergedWithNext", SplitBehavior::MergedWithNext},
      {"Contiguous", SplitBehavior::Contiguous}};
  const std::string behavior = node.contains("behavior") && node["behavior"].is_string()
                                   ? node["behavior"].get<std::string>() : "";
  bool known = false;
  for (const auto& [name, value] : kBehaviors) {
    if (behavior != name) continue;
    split.behavior = value;
    known = true;
  }
  if (!known)
    bad("a Split pre-tokenizer's behavior is {}; expected one of Removed, Isolated, "
        "MergedWithPrevious, MergedWithNext, Contiguous",
        node.contains("behavior") ? node["behavior"].dump() : "missing");
  split.invert = flag(node, "invert", false, "a Split pre-tokenizer");
  if (is_regex) split.source = pattern["Regex"].get<std::string>();
  return split;
}

void TokenizerJson::add_pre_tokenizer_steps(const json& node, std::vector<PreTokenizer::Step>& steps) const {
  const std::string type = type_of(node, "a pre_tokenizer");
  if (type == "Sequence") {
    if (!node.contains("pretokenizers") || !node["pretokenizers"].is_array())
      bad("a Sequence pre-tokenizer has no \"pretokenizers\" list");
    for (const json& child : node["pretokenizers"]) add_pre_tokenizer_steps(child, steps);
  } else if (type == "Split") {
    steps.emplace_back(read_split(node));
  } else if (type == "ByteLevel") {
    steps.emplace_back(PreTokenizer::ByteLevel{flag(node, "add_prefix_space", true, "the ByteLevel pre-tokenizer"),
                                               flag(node, "use_regex", true, "the ByteLevel pre-tokenizer")});
  } else {
    bad("pre-tokenizer '{}' is not supported; fsdpq reads byte-level tokenizers, whose pre_tokenizer is "
        "Split and ByteLevel steps",
        type);
  }
}

PreTokenizer TokenizerJson::read_pre_tokenizer(const json& root) const {
  std::vector<PreTokenizer::Step> steps;
  if (root.contains("pre_tokenizer") && !root["pre_tokenizer"].is_null())
    add_pre_tokenizer_steps(root["pre_tokenizer"], steps);
  size_t byte_level_steps = 0;
  for (const auto& step : steps) byte_level_steps += std::holds_alternative<PreTokenizer::ByteLevel>(step);
  // ByteLevel turns the text into byte characters: a step after it would see those, not the text.
  if (byte_level_steps != 1 || !std::holds_alternative<PreTokenizer::ByteLevel>(steps.back()))
    bad("the pre_tokenizer has {} ByteLevel step(s){}; fsdpq reads byte-level tokenizers, whose "
        "pre_tokenizer ends with its one ByteLevel step",
        byte_level_steps, byte_level_steps == 1 ? ", not at the end" : "");
  return PreTokenizer(std::move(steps));
}

void TokenizerJson::check_decoder(const json& root) const {
  const json decoder = root.contains("decoder") ? root["decoder"] : json();
  if (decoder.is_null() || type_of(decoder, "the decoder") != "ByteLevel")
    bad("decoder {} is not supported; byte-level tokenizers decode with ByteLevel",
        decoder.is_object() && decoder.contains("type") ? decoder["type"].dump() : decoder.dump());
}

void TokenizerJson::read_template(const json& node, BpeTokenizer::Parts& parts) const {
  if (!node.contains("single") || !node["single"].is_array())
    bad("the TemplateProcessing post-processor has no \"single\" list");
  const json special_tokens = node.contains("special_tokens") ? node["special_tokens"] : json::object();
  bool after_sequence = false;
  for (const json& piece : node["single"]) {
    if (piece.contains("Sequence")) {
      after_sequence = true;
      continue;
    }
    const json name = piece.contains("SpecialToken") ? piece["SpecialToken"].value("id", json()) : json();
    if (!name.is_string())
      bad("a TemplateProcessing piece is {}; expected {{\"SpecialToken\": {{\"id\": ...}}}} or "
          "{{\"Sequence\": ...}}",
          piece.dump().substr(0, 80));
    const std::string token = name.get<std::string>();
    if (!special_tokens.contains(token) || !special_tokens[token].contains("ids") ||
        !special_tokens[token]["ids"].is_array())
      bad("the TemplateProcessing post-processor uses \"{}\" but its special_tokens give it no ids", token);
    for (const json& id : special_tokens[token]["ids"]) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= std::numeric_limits<int32_t>::max())
        bad("the TemplateProcessing special token \"{}\" has id {}; expected a non-negative integer", token, id.dump());
      (after_sequence ? parts.template_suffix : parts.template_prefix).push_back(id.get<int32_t>());
    }
  }
}

void TokenizerJson::read_post_processor(const json& processor, BpeTokenizer::Parts& parts) const {
  if (processor.is_null()) return;
  const std::string type = type_of(processor, "the post_processor");
  if (type == "ByteLevel") return;  // it only trims offsets, which fsdpq does not keep
  if (type == "TemplateProcessing") return read_template(processor, parts);
  if (type == "Sequence" && processor.contains("processors") && processor["processors"].is_array()) {
    for (const json& child : processor["processors"]) read_post_processor(child, parts);
    return;
  }
  bad("post-processor '{}' is not supported; expected TemplateProcessing, ByteLevel, a Sequence of "
      "them, or null",
      type);
}

}  // namespace

std::unique_ptr<BpeTokenizer> load_hf_tokenizer_json(const fs::path& file) {
  const TokenizerJson reader(file);
  const json root = reader.parse();
  const json& model = reader.bpe_model(root);
  reader.check_normalizer(root);

  PreTokenizer pre_tokenizer = reader.read_pre_tokenizer(root);
  reader.check_decoder(root);
  BpeTokenizer::Parts parts;
  parts.file = file;
  parts.kind = "tokenizer.json";
  reader.read_vocab(model, parts);
  const std::vector<BpeModel::Merge> merges = reader.read_merges(model, parts);
  parts.added_tokens = reader.read_added_tokens(root, parts);
  reader.read_post_processor(root.contains("post_processor") ? root["post_processor"] : json(), parts);

  // The model encodes raw bytes: each vocab token written in the byte-level alphabet, by its bytes.
  std::vector<std::pair<std::string, int32_t>> tokens;
  tokens.reserve(parts.vocab_ids.size());
  for (const auto& [text, id] : parts.vocab_ids)
    if (std::optional<std::string> bytes = byte_level::bytes_of_token(text)) tokens.emplace_back(std::move(*bytes), id);
  BpeModel bpe(std::move(tokens), reader.byte_symbols(model, parts), merges, reader.read_model_options(model, parts));

  for (const AddedToken& t : parts.added_tokens) {
    if (parts.token_text.size() <= static_cast<size_t>(t.id)) parts.token_text.resize(t.id + 1);
    parts.token_text[t.id] = t.content;
  }
  parts.details = fmt::format("{} tokens, {} merges, {} added tokens", parts.vocab_ids.size(),
                              merges.size(), parts.added_tokens.size());
  SpecialTokenNames names = read_special_token_names(file);
  parts.bos_name = names.bos;
  parts.eos_name = names.eos;
  parts.pad_name = names.pad;
  parts.names_source = names.source;
  return std::make_unique<BpeTokenizer>(std::move(bpe), std::move(pre_tokenizer), std::move(parts));
}

}  // namespace fsdpq::data
