#include "data/packing.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace fsdpq::data {

namespace {

// First-fit decreasing over lengths[begin, end): appends the window's rows to `rows`.
void pack_window(const std::vector<int64_t>& lengths, size_t begin, size_t end, int64_t context_length,
                 std::vector<std::vector<size_t>>& rows) {
  std::vector<size_t> order(end - begin);
  std::iota(order.begin(), order.end(), begin);
  // Longest first; equal lengths keep the sampler's order, so the result depends on nothing else.
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return lengths[a] > lengths[b]; });
  std::vector<std::vector<size_t>> window_rows;
  std::vector<int64_t> room;
  for (size_t i : order) {
    const int64_t n = lengths[i];
    if (n < 1 || n > context_length)
      throw std::logic_error(fmt::format("pack_rows: example {} has {} tokens; expected 1..{}", i, n, context_length));
    size_t r = 0;
    while (r < room.size() && room[r] < n) ++r;
    if (r == room.size()) {
      window_rows.emplace_back();
      room.push_back(context_length);
    }
    window_rows[r].push_back(i);
    room[r] -= n;
  }
  for (auto& row : window_rows) std::sort(row.begin(), row.end());
  // Rows in the order of their first example: the window's rows follow the shuffled order.
  std::sort(window_rows.begin(), window_rows.end(), [](const auto& a, const auto& b) { return a.front() < b.front(); });
  for (auto& row : window_rows) rows.push_back(std::move(row));
}

}  // namespace

std::vector<std::vector<size_t>> pack_rows(const std::vector<int64_t>& lengths, int64_t context_length, size_t window) {
  if (window == 0) throw std::logic_error("pack_rows: the window must hold at least one example");
  std::vector<std::vector<size_t>> rows;
  for (size_t begin = 0; begin < lengths.size(); begin += window)
    pack_window(lengths, begin, std::min(lengths.size(), begin + window), context_length, rows);
  return rows;
}

std::vector<std::vector<size_t>> deal_rows(const std::vector<int64_t>& row_tokens, int world_size,
                                           int64_t rows_per_rank) {
  if (world_size < 1 || rows_per_rank < 1 ||
      static_cast<int64_t>(row_tokens.size()) > static_cast<int64_t>(world_size) * rows_per_rank)
    throw std::logic_error(fmt::format("deal_rows: {} rows do not fit {} ranks of {} rows", row_tokens.size(),
                                       world_size, rows_per_rank));
  std::vector<size_t> order(row_tokens.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return row_tokens[a] > row_tokens[b]; });
  std::vector<std::vector<size_t>> dealt(static_cast<size_t>(world_size));
  std::vector<int64_t> tokens(static_cast<size_t>(world_size), 0);
  for (size_t row : order) {
    size_t best = dealt.size();
    for (size_t rank = 0; rank < dealt.size(); ++rank)
      if (static_cast<int64_t>(dealt[rank].size()) < rows_per_rank && (best == dealt.size() || tokens[rank] < tokens[best]))
        best = rank;
    dealt[best].push_back(row);
    tokens[best] += row_tokens[row];
  }
  for (auto& rows : dealt) std::sort(rows.begin(), rows.end());
  return dealt;
}

}  // namespace fsdpq::data
