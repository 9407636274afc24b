#include <malloc.h>

#include "app/cli_main.h"

int main(int argc, char** argv) {
  // Large buffers (a layer being loaded, gathered parameters) come and go all the time under
  // sharding. glibc raises its mmap threshold after the first large free, after which such
  // buffers come from the heap and, fragmented between long-lived shards, are never returned:
  // a 4-rank QLoRA load of a 1.1B model kept 1.36 GiB per rank instead of 0.16 GiB. A fixed
  // threshold keeps every large buffer its own mapping, returned when freed.
  mallopt(M_MMAP_THRESHOLD, 256 * 1024);
  return fsdpq::cli_main(argc, argv);
}
