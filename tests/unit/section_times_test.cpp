// FSDPQ_SECTION_TIMES' accounting (backend/section_times.h) on the CPU backend: spans summed by
// name, largest first; nothing recorded when off.
#include "backend/section_times.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace fsdpq {
namespace {

void busy(std::chrono::milliseconds d) { std::this_thread::sleep_for(d); }

TEST(SectionTimes, SumsSpansByNameLargestFirst) {
  const bool was = section_times_enabled();
  set_section_times_enabled(true);
  reset_section_times();
  for (int i = 0; i < 3; ++i) {
    ScopedSection s("short");
    busy(std::chrono::milliseconds(2));
  }
  {
    ScopedSection s("long");
    busy(std::chrono::milliseconds(20));
  }
  const std::vector<SectionTotal> totals = section_totals();
  ASSERT_EQ(totals.size(), 2u);
  EXPECT_EQ(totals[0].name, "long");
  EXPECT_EQ(totals[0].count, 1);
  EXPECT_GE(totals[0].seconds, 0.020);
  EXPECT_EQ(totals[1].name, "short");
  EXPECT_EQ(totals[1].count, 3);
  EXPECT_GE(totals[1].seconds, 0.006);

  set_section_times_enabled(false);
  reset_section_times();
  {
    ScopedSection s("off");
    busy(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(section_totals().empty());
  set_section_times_enabled(was);
}

}  // namespace
}  // namespace fsdpq
