// The digests of tests/data/*: a text's (or a record's) token ids as a count and a 64-bit FNV-1a,
// computed as tests/reference/llama3_token_ids.py computes them.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace fsdpq::test {

struct Digest {
  size_t count = 0;
  uint64_t fnv = 0;
  bool operator==(const Digest&) const = default;
};

inline std::ostream& operator<<(std::ostream& out, const Digest& d) {
  return out << d.count << " ids, FNV " << std::hex << d.fnv << std::dec;
}

// Each id as 4 little-endian bytes, and 0xFFFFFFFF after each text.
inline Digest digest_of_ids(const std::vector<std::vector<int32_t>>& texts) {
  Digest d{0, 0xCBF29CE484222325ull};
  auto feed = [&](uint32_t value) {
    for (int byte = 0; byte < 4; ++byte) d.fnv = (d.fnv ^ ((value >> (8 * byte)) & 0xFF)) * 0x100000001B3ull;
  };
  for (const auto& ids : texts) {
    for (int32_t id : ids) feed(static_cast<uint32_t>(id));
    feed(0xFFFFFFFFu);
    d.count += ids.size();
  }
  return d;
}

inline Digest digest_of(const data::Tokenizer& tokenizer, const std::vector<std::string>& texts) {
  std::vector<std::vector<int32_t>> ids;
  for (const auto& text : texts) ids.push_back(tokenizer.encode(text));
  return digest_of_ids(ids);
}

// "COUNT HEX" or, where tiktoken differs, "COUNT HEX COUNT HEX" (the second pair is tiktoken's).
inline Digest parse_digest(const std::string& line, bool tiktoken) {
  std::istringstream in(line);
  Digest d;
  in >> d.count >> std::hex >> d.fnv >> std::dec;
  Digest second;
  if (tiktoken && (in >> second.count >> std::hex >> second.fnv)) return second;
  return d;
}

// A record's texts as the reference script lists them: its values in file order, then the
// fsdp_qlora-formatted example (Alpaca for alpaca.jsonl, the sql template for sql.jsonl).
inline std::vector<std::string> record_texts(const std::string& jsonl_line, const std::string& file) {
  const auto record = nlohmann::ordered_json::parse(jsonl_line);
  std::vector<std::string> texts;
  for (const auto& [key, value] : record.items()) texts.push_back(value.get<std::string>());
  const auto field = [&](const char* key) { return record.value(key, std::string()); };
  if (file == "alpaca.jsonl") {
    const bool has_input = !field("input").empty();
    std::string example = has_input ? "Below is an instruction that describes a task, paired with an input that "
                                      "provides further context. Write a response that appropriately completes "
                                      "the request.\n\n"
                                    : "Below is an instruction that describes a task. Write a response that "
                                      "appropriately completes the request.\n\n";
    example += "### Instruction:\n" + field("instruction") + "\n\n";
    if (has_input) example += "### Input:\n" + field("input") + "\n\n";
    texts.push_back(example + "### Response:" + field("output"));
  } else {
    texts.push_back("###Context:\n" + field("context") + "\n###Question:\n" + field("question") + "\n###Answer:\n" +
                    field("answer"));
  }
  return texts;
}

}  // namespace fsdpq::test
