#include "runtime/fault_injection.h"

#include <cstdlib>
#include <stdexcept>
#include <string>

#include "util/strings.h"

namespace fsdpq {

void maybe_inject_fault(const World& world, std::string_view point) {
  const char* spec = std::getenv("FSDPQ_INJECT_FAULT");
  if (!spec || !*spec) return;
  auto parts = split(spec, ':');
  if (parts.size() != 2) return;
  auto rank = parse_int(parts[0]);
  if (rank && *rank == world.rank && parts[1] == point)
    throw std::runtime_error("injected fault at " + std::string(point) + " (FSDPQ_INJECT_FAULT)");
}

}  // namespace fsdpq
