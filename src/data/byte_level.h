// GPT-2's byte-level alphabet, which byte-level BPE vocabularies (GPT-2, Llama-3, Qwen ...) are
// written in: each of the 256 byte values stands as one printable Unicode character ("Ġ" for the
// space byte), so a token of raw bytes is written as a valid UTF-8 string.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace fsdpq::data::byte_level {

// The character (as UTF-8) that stands for byte `b`.
const std::string& char_of_byte(uint8_t b);

// The raw bytes a token written in the alphabet stands for; nullopt when `token` holds a
// character outside the alphabet (such a token can never come out of byte-level encoding).
std::optional<std::string> bytes_of_token(std::string_view token);

// What Hugging Face's ByteLevel decoder makes of one token: its raw bytes when every character is
// in the alphabet, else the token's own UTF-8 (added tokens such as "<|eot_id|>" decode that way).
std::string decode_token(std::string_view token);

}  // namespace fsdpq::data::byte_level
