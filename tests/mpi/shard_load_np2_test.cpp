// Sharded loading on 2 ranks (the tests: mpi/shard_load_tests.h).
#include "mpi/shard_load_tests.h"
