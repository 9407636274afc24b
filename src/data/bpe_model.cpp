#include "data/bpe_model.h"

#include <algorithm>
#include <functional>

namespace fsdpq::data {

// The merge map: (left, right) → (rank, merged), open addressing on one 64-bit key. A lookup is
// the innermost step of encoding, so it avoids std::unordered_map's node chasing.
class BpeModel::PairTable {
 public:
  struct Value {
    uint32_t rank;
    int32_t merged;
  };

  explicit PairTable(size_t count) {
    size_t capacity = 16;
    while (capacity < 2 * count) capacity *= 2;
    slots_.assign(capacity, Slot{kEmpty, {}});
    mask_ = capacity - 1;
  }

  void insert_or_assign(int32_t left, int32_t right, Value value) {
    const uint64_t key = key_of(left, right);
    for (size_t i = slot_of(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == kEmpty || slots_[i].key == key) {
        slots_[i] = {key, value};
        return;
      }
    }
  }

  const Value* find(int32_t left, int32_t right) const {
    const uint64_t key = key_of(left, right);
    for (size_t i = slot_of(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return &slots_[i].value;
      if (slots_[i].key == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};  // ids are non-negative, so no pair has it
  struct Slot {
    uint64_t key;
    Value value;
  };
  static uint64_t key_of(int32_t left, int32_t right) {
    return (uint64_t{static_cast<uint32_t>(left)} << 32) | static_cast<uint32_t>(right);
  }
  size_t slot_of(uint64_t key) const { return (key * 0x9E3779B97F4A7C15ull) >> 17 & mask_; }

  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

BpeModel::BpeModel(std::vector<std::pair<std::string, int32_t>> tokens,
                   std::array<ByteSymbol, 256> byte_symbols, const std::vector<Merge>& merges,
                   Options options)
    : byte_symbols_(std::move(byte_symbols)),
      pairs_(std::make_unique<PairTable>(merges.size())),
      options_(options) {
  ids_by_bytes_.reserve(tokens.size());
  for (auto& [bytes, id] : tokens) ids_by_bytes_.emplace(std::move(bytes), id);
  for (const Merge& m : merges) pairs_->insert_or_assign(m.left, m.right, {m.rank, m.merged});
}

BpeModel::~BpeModel() = default;
BpeModel::BpeModel(BpeModel&&) noexcept = default;

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (options_.ignore_merges) {
    if (auto it = ids_by_bytes_.find(word); it != ids_by_bytes_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  thread_local std::vector<int32_t> symbols;
  start_symbols(word, symbols);
  merge_symbols(symbols);
  out.insert(out.end(), symbols.begin(), symbols.end());
}

// Hugging Face's BPE::merge_word, one byte-level character (= one byte) at a time. Its quirk is
// kept: a pending unk is written out before a known byte, but not before byte-fallback tokens.
void BpeModel::start_symbols(std::string_view word, std::vector<int32_t>& symbols) const {
  symbols.clear();
  constexpr int32_t kNone = -1;
  int32_t pending_unk = kNone;
  for (char c : word) {
    const ByteSymbol& start = byte_symbols_[static_cast<unsigned char>(c)];
    if (!start.ids.empty() && !start.byte_fallback) {
      if (pending_unk != kNone) symbols.push_back(pending_unk);
      pending_unk = kNone;
      symbols.push_back(start.ids[0]);
    } else if (!start.ids.empty()) {
      symbols.insert(symbols.end(), start.ids.begin(), start.ids.end());
    } else if (options_.unk_id) {
      if (pending_unk != kNone && !options_.fuse_unk) symbols.push_back(pending_unk);
      pending_unk = *options_.unk_id;
    }
  }
  if (pending_unk != kNone) symbols.push_back(pending_unk);
}

// Hugging Face's Word::merge_all: a min-heap of candidate merges by (rank, position); a popped
// candidate is stale when its symbol was merged away or the pair there now makes another token.
void BpeModel::merge_symbols(std::vector<int32_t>& symbols) const {
  if (symbols.size() < 2) return;
  struct Symbol {
    int32_t id;
    int32_t prev, next;  // -1 at the ends
    bool removed;
  };
  struct Candidate {
    uint32_t rank;
    uint32_t pos;
    int32_t merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  thread_local std::vector<Symbol> word;
  thread_local std::vector<Candidate> heap;  // a min-heap through std::greater
  const int32_t n = static_cast<int32_t>(symbols.size());
  word.resize(n);
  for (int32_t i = 0; i < n; ++i) word[i] = {symbols[i], i - 1, i + 1 < n ? i + 1 : -1, false};

  heap.clear();
  auto push_pair = [&](int32_t pos) {
    const Symbol& left = word[pos];
    if (left.next < 0) return;
    if (const PairTable::Value* m = pairs_->find(left.id, word[left.next].id)) {
      heap.push_back({m->rank, static_cast<uint32_t>(pos), m->merged});
      std::push_heap(heap.begin(), heap.end(), std::greater<>{});
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) push_pair(i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>{});
    const Candidate top = heap.back();
    heap.pop_back();
    Symbol& left = word[top.pos];
    if (left.removed || left.next < 0) continue;
    Symbol& right = word[left.next];
    const PairTable::Value* now = pairs_->find(left.id, right.id);
    if (!now || now->merged != top.merged) continue;  // stale
    left.id = top.merged;
    right.removed = true;
    left.next = right.next;
    if (right.next >= 0) word[right.next].prev = static_cast<int32_t>(top.pos);
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(static_cast<int32_t>(top.pos));
  }
  symbols.clear();
  for (const Symbol& s : word)
    if (!s.removed) symbols.push_back(s.id);
}

}  // namespace fsdpq::data
