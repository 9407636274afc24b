#include "app/cli_main.h"

#include <cstdio>

namespace fsdpq {
int cli_main(int argc, char** argv) {
  std::puts("fsdpq: under construction");
  return 0;
}
}  // namespace fsdpq
