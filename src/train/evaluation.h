// Scoring a model on examples: the token-weighted mean loss of fsdp_qlora's evaluation (no
// dropout, no gradients), over every rank of a group, and how a run reports it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/examples.h"
#include "fsdp/collectives.h"
#include "model/llama_model.h"

namespace fsdpq {

// Token-weighted mean loss over `examples`; NaN when no example has a target token. With `world`,
// every rank of it calls this and evaluates a share of the batches; all get the global mean. With
// padding_free each batch's examples are laid end to end in one row (the same loss, no padding).
double evaluate_loss(LlamaModel& model, const std::vector<data::Example>& examples, int64_t batch_size,
                     int32_t pad_id, int64_t context_length, Communicator* world = nullptr,
                     bool padding_free = false);

// "eval loss 1.2345 (perplexity 3.44) on 120 examples (3 of 123 keep no target token after
// truncation and are left out)", or that there is no loss: the log line of an evaluation.
std::string describe_eval(double loss, const std::vector<data::Example>& examples);

}  // namespace fsdpq
