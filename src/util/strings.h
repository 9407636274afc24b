// Small string helpers shared by the config, CLI and data readers.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fsdpq {

std::string_view trim(std::string_view s);
std::string to_lower(std::string_view s);
std::vector<std::string> split(std::string_view s, char sep, bool trim_parts = true);
std::string join(const std::vector<std::string>& parts, std::string_view sep);
bool starts_with(std::string_view s, std::string_view prefix);
bool ends_with(std::string_view s, std::string_view suffix);

// Strict parsers: the whole string must be consumed; no silent truncation.
std::optional<int64_t> parse_int(std::string_view s);
std::optional<double> parse_double(std::string_view s);
std::optional<bool> parse_bool(std::string_view s);  // true/false, yes/no, on/off, 1/0

// Levenshtein distance, for "did you mean" suggestions.
size_t edit_distance(std::string_view a, std::string_view b);
// The closest candidate within a small distance, or "" when nothing is close.
std::string closest_match(std::string_view word, const std::vector<std::string>& candidates);

// Human-readable byte counts (1.5 GiB) and counts (6.74 B).
std::string human_bytes(double bytes);
std::string human_count(double n);

// True when `s` is valid UTF-8.
bool is_valid_utf8(std::string_view s);

}  // namespace fsdpq
