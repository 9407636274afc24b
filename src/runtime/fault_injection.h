// Deliberate failures for tests of fsdpq's error handling: FSDPQ_INJECT_FAULT=RANK:POINT makes
// rank RANK throw at the named point (e.g. "1:after_setup"), to prove that a failure on one rank
// ends the whole job promptly with that rank's message. Costs one getenv per point when unset.
#pragma once
#include <string_view>

#include "runtime/world.h"

namespace fsdpq {

void maybe_inject_fault(const World& world, std::string_view point);

}  // namespace fsdpq
