// What a run trains on top of: its frozen base weights and its tokenizer, reduced to a fingerprint
// that a training checkpoint records, so that resuming onto another model of the same shape (or
// another tokenizer) is an error that says what differs rather than a silent continuation.
//
// The weights: per tensor of an HF directory, a 64-bit hash of its dtype, shape, length and three
// sampled 4 KiB windows (start, middle, end) of its bytes — about 12 KiB read per tensor, so under
// 10 MB for a 70B model, yet any retrained or re-quantised variant differs in every window. A
// preset is fingerprinted by its name (its weights are a function of it: init seed 0).
// The tokenizer: its vocabulary size, bos / eos / pad ids and a hash of every id's piece and of the
// ids of a fixed probe text, which is what training depends on, whatever file it came from.
#pragma once
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "data/tokenizer.h"
#include "model/model_source.h"

namespace fsdpq {

// {"model": {...}, "tokenizer": {...}}; UserError naming the directory when its files cannot be read.
nlohmann::json base_fingerprint(const ModelSource& model, const data::Tokenizer& tokenizer);

// What differs between a checkpoint's fingerprint and this run's, in words ("the base weights: 287
// of 291 tensors differ, first 'model.embed_tokens.weight'; ..."), or nullopt when they match.
std::optional<std::string> fingerprint_difference(const nlohmann::json& checkpoint, const nlohmann::json& run);

}  // namespace fsdpq
