// Errors that every rank agrees on. Start-up steps (config, model files, data) run on every
// rank; if any rank fails, all ranks learn the first failing rank's message and stop together,
// so the user reads one clear message (printed by rank 0) and no rank is left waiting.
#pragma once
#include <functional>
#include <stdexcept>
#include <string>

#include "runtime/world.h"

namespace fsdpq {

struct AgreedError : std::runtime_error {
  AgreedError(const std::string& message, int exit_code, int origin_rank)
      : std::runtime_error(message), exit_code(exit_code), origin_rank(origin_rank) {}
  int exit_code;
  int origin_rank;
};

// Runs `step` on this rank, then agrees with all ranks: if it threw anywhere, every rank throws
// the AgreedError of the lowest failing rank. Collective: every rank must call it.
void run_on_all_ranks(const World& world, const std::function<void()>& step);

}  // namespace fsdpq
