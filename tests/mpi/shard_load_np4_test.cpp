// Sharded loading on 4 ranks (the tests: mpi/shard_load_tests.h).
#include "mpi/shard_load_tests.h"
