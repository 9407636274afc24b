#include "data/byte_level.h"

#include <array>
#include <unordered_map>

namespace fsdpq::data::byte_level {

namespace {

std::string utf8_of(uint32_t code_point) {  // code points below 0x800 are all the alphabet needs
  std::string out;
  if (code_point < 0x80) {
    out.push_back(static_cast<char>(code_point));
  } else {
    out.push_back(static_cast<char>(0xC0 | (code_point >> 6)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  }
  return out;
}

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves; the others (controls,
// space, DEL, NBSP, soft hyphen) take the code points from 256 on, in byte order.
struct Alphabet {
  std::array<std::string, 256> char_of_byte;
  std::unordered_map<std::string, uint8_t> byte_of_char;
  Alphabet() {
    uint32_t next_extra = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      char_of_byte[b] = utf8_of(printable ? b : next_extra++);
      byte_of_char.emplace(char_of_byte[b], static_cast<uint8_t>(b));
    }
  }
};

const Alphabet& alphabet() {
  static const Alphabet table;
  return table;
}

size_t utf8_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead >> 5) == 0x6) return 2;
  if ((lead >> 4) == 0xE) return 3;
  return 4;
}

}  // namespace

const std::string& char_of_byte(uint8_t b) { return alphabet().char_of_byte[b]; }

std::optional<std::string> bytes_of_token(std::string_view token) {
  const auto& byte_of_char = alphabet().byte_of_char;
  std::string bytes;
  bytes.reserve(token.size());
  for (size_t i = 0; i < token.size();) {
    const size_t n = utf8_length(static_cast<unsigned char>(token[i]));
    auto it = byte_of_char.find(std::string(token.substr(i, n)));
    if (it == byte_of_char.end()) return std::nullopt;
    bytes.push_back(static_cast<char>(it->second));
    i += n;
  }
  return bytes;
}

std::string decode_token(std::string_view token) {
  std::optional<std::string> bytes = bytes_of_token(token);
  return bytes ? *bytes : std::string(token);
}

}  // namespace fsdpq::data::byte_level
