// The BPE model of a byte-level tokenizer: turns one pre-token (raw bytes) into token ids by
// merging adjacent symbols in rank order, exactly as Hugging Face tokenizers' BPE does
// (models/bpe/word.rs: lowest rank first, leftmost on ties). tiktoken's rule (merge the pair whose
// concatenation has the lowest rank) is the same algorithm with the rank of a pair set to the rank
// of the token it makes, so both file formats share this model.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace fsdpq::data {

class BpeModel {
 public:
  struct Merge {
    int32_t left, right;  // the adjacent pair
    int32_t merged;       // the token the pair becomes
    uint32_t rank;        // lower merges first
  };

  // What one byte of a word starts as.
  struct ByteSymbol {
    std::vector<int32_t> ids;    // empty: the byte has no token (it becomes unk, or nothing)
    bool byte_fallback = false;  // ids are <0xXX> byte-fallback tokens
  };

  struct Options {
    bool ignore_merges = false;      // a word that is itself a token is that token, unmerged
    std::optional<int32_t> unk_id;   // what a byte with no token becomes (else it is dropped)
    bool fuse_unk = false;           // consecutive unknown bytes become one unk
  };

  // `tokens`: every token a word can become, as raw bytes → id. Later merges of the same pair
  // replace earlier ones, as in Hugging Face's merge map.
  BpeModel(std::vector<std::pair<std::string, int32_t>> tokens,
           std::array<ByteSymbol, 256> byte_symbols, const std::vector<Merge>& merges,
           Options options);
  ~BpeModel();
  BpeModel(BpeModel&&) noexcept;

  // Appends the ids of one pre-token (raw bytes, non-empty) to `out`. Thread-safe.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  // The starting symbols of `word` (Hugging Face's merge_word before merging).
  void start_symbols(std::string_view word, std::vector<int32_t>& symbols) const;
  void merge_symbols(std::vector<int32_t>& symbols) const;

  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> ids_by_bytes_;
  std::array<ByteSymbol, 256> byte_symbols_;
  class PairTable;
  std::unique_ptr<PairTable> pairs_;
  Options options_;
};

}  // namespace fsdpq::data
