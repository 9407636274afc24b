// Sequence packing (docs/packing.md): which examples share a row of context_length tokens, and
// which rank computes which row.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace fsdpq::data {

// First-fit decreasing runs within windows of this many consecutive examples of the sampler's
// order: long enough that short examples fill the gaps long ones leave (FFD packs sql's records
// into ~97% full rows), short enough that a step still holds examples from one stretch of the
// shuffled order, not the epoch's longest ones together.
inline constexpr size_t kPackingWindow = 1024;

// lengths[i]: the tokens of the i-th example in visiting order, each in [1, context_length].
// Returns the rows, each the indices (into lengths, ascending) of the examples laid end to end in
// it, ordered by their first example. Every example is in exactly one row. Deterministic: a
// function of the lengths, their order and context_length alone (not of the world size).
std::vector<std::vector<size_t>> pack_rows(const std::vector<int64_t>& lengths, int64_t context_length,
                                           size_t window = kPackingWindow);

// One micro-batch's rows over the ranks, balanced by tokens: longest row first, each to the rank
// with the fewest tokens so far that has fewer than rows_per_rank rows (ties: the lower rank).
// Returns, per rank, the indices into row_tokens it computes (ascending). Needs
// row_tokens.size() <= world_size × rows_per_rank; a rank may get none in an epoch's last,
// short micro-batch.
std::vector<std::vector<size_t>> deal_rows(const std::vector<int64_t>& row_tokens, int world_size,
                                           int64_t rows_per_rank);

}  // namespace fsdpq::data
