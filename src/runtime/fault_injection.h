// Deliberate failures for tests of fsdpq's error handling: FSDPQ_INJECT_FAULT=RANK:POINT makes
// rank RANK throw at the named point (e.g. "1:after_setup"), to prove that a failure on one rank
// ends the whole job promptly with that rank's message; RANK:POINT:kill makes it die of SIGKILL
// there instead (kill-and-resume tests), RANK:POINT:usr1 / :term send it that signal (preemption
// tests), RANK:POINT:stop / :hang / :slow freeze the process, block the caller forever, or work
// 8 s while reporting progress (watchdog tests); RANK "*" means every rank. Costs one getenv per point when unset. Points: load_data,
// after_plan, load_unit_U (a sharded rank reading its shard of unit U), after_load, after_step_N, checkpoint_write_N (halfway through writing step N's checkpoint).
#pragma once
#include <string_view>

#include "runtime/world.h"

namespace fsdpq {

void maybe_inject_fault(const World& world, std::string_view point);

}  // namespace fsdpq
