// The MPI runtime on 2 ranks: world layout and errors that all ranks agree on.
#include <gtest/gtest.h>

#include "runtime/agreed_errors.h"
#include "runtime/world.h"
#include "util/error.h"

namespace fsdpq {
namespace {

World make_world() { return describe_world(detect_launcher()); }

TEST(MpiWorld, TwoRanksOnOneNode) {
  World w = make_world();
  EXPECT_EQ(w.size, 2);
  EXPECT_EQ(w.num_nodes, 1);
  EXPECT_EQ(w.node, 0);
  EXPECT_EQ(w.local_size, 2);
  EXPECT_EQ(w.local_rank, w.rank);
  EXPECT_EQ(w.launcher, "mpirun");
  EXPECT_FALSE(w.hostname.empty());
}

TEST(MpiAgreedErrors, AllRanksGetTheFailingRanksMessage) {
  World w = make_world();
  try {
    run_on_all_ranks(w, [&] {
      if (w.rank == 1) fail("data file broken on rank {}", w.rank);
    });
    FAIL() << "expected an AgreedError on every rank";
  } catch (const AgreedError& e) {
    EXPECT_STREQ(e.what(), "data file broken on rank 1");
    EXPECT_EQ(e.origin_rank, 1);
    EXPECT_EQ(e.exit_code, 2);
  }
}

TEST(MpiAgreedErrors, LowestFailingRankWins) {
  World w = make_world();
  try {
    run_on_all_ranks(w, [&] { fail("rank {} failed", w.rank); });
    FAIL();
  } catch (const AgreedError& e) {
    EXPECT_STREQ(e.what(), "rank 0 failed");
  }
}

TEST(MpiAgreedErrors, NoErrorNoThrow) {
  World w = make_world();
  EXPECT_NO_THROW(run_on_all_ranks(w, [] {}));
}

}  // namespace
}  // namespace fsdpq
