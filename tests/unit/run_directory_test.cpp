// Run directories (train/run_directory.h): the lock two runs contend for, the writability probes,
// what counts as a previous run, and the rewind of a continued run's metrics.
#include "train/run_directory.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "test_support.h"
#include "train/metrics_log.h"

namespace fsdpq {
namespace {

namespace fs = std::filesystem;
using test::error_of;

std::vector<nlohmann::json> records(const fs::path& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));  // every line must parse
  return out;
}

TEST(RunDirectory, ASecondLockOnTheDirectoryIsRefusedNamingTheHolder) {
  const fs::path dir = test::make_temp_dir("lock") / "run";
  {
    DirectoryLock first = DirectoryLock::acquire(dir, "output_dir");
    EXPECT_TRUE(first.exclusive());
    EXPECT_TRUE(fs::is_directory(dir)) << "acquire creates the directory";
    // flock belongs to the open file: a second open in this very process contends as another run would.
    const std::string message = error_of([&] { DirectoryLock::acquire(dir, "output_dir"); });
    EXPECT_NE(message.find("output_dir '" + dir.string() + "' is in use by another fsdpq run (pid " +
                           std::to_string(::getpid()) + " on host "),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("choose another output_dir"), std::string::npos) << message;
  }
  // Released with its owner (and by the kernel when a process dies): the directory is free again.
  EXPECT_EQ(error_of([&] { DirectoryLock::acquire(dir, "output_dir"); }), "<no error>");
}

TEST(RunDirectory, UnwritableOrImpossibleDirectoriesAreNamedWithTheCause) {
  const fs::path base = test::make_temp_dir("writable");
  test::write_file(base / "a_file", "x");
  EXPECT_EQ(error_of([&] { check_writable_directory(base / "a_file" / "out", "checkpoint_dir"); }),
            "checkpoint_dir '" + (base / "a_file" / "out").string() + "': cannot create the directory: Not a directory");
  EXPECT_EQ(error_of([&] { DirectoryLock::acquire(base / "a_file", "output_dir"); }),
            "output_dir '" + (base / "a_file").string() + "': cannot create the directory: Not a directory");
  EXPECT_EQ(error_of([&] { check_creatable_directory(base / "a_file" / "x" / "y", "output_dir"); }),
            "output_dir '" + (base / "a_file" / "x" / "y").string() + "': cannot create the directory: '" +
                (base / "a_file").string() + "' is not a directory");
  // Fine: nothing is created by the check, and a writable directory passes its probe.
  EXPECT_EQ(error_of([&] { check_creatable_directory(base / "new" / "deeper", "output_dir"); }), "<no error>");
  EXPECT_FALSE(fs::exists(base / "new"));
  EXPECT_EQ(error_of([&] { check_writable_directory(base / "made", "output_dir"); }), "<no error>");
  EXPECT_TRUE(fs::is_directory(base / "made"));
  EXPECT_TRUE(fs::is_empty(base / "made")) << "the probe file is removed";
  if (::geteuid() != 0) {  // root writes anywhere
    fs::create_directories(base / "read_only");
    fs::permissions(base / "read_only", fs::perms::owner_read | fs::perms::owner_exec);
    EXPECT_EQ(error_of([&] { check_writable_directory(base / "read_only", "output_dir"); }),
              "output_dir '" + (base / "read_only").string() + "' is not writable: Permission denied");
  }
}

TEST(RunDirectory, APreviousRunIsItsMetricsLogsTracesAndCheckpoints) {
  const fs::path out = test::make_temp_dir("previous"), ck = out / "checkpoints";
  EXPECT_TRUE(find_previous_run(out, ck).empty());
  fs::create_directories(ck);
  test::write_file(out / "adapter_config.json", "{}");  // a saved model alone is not a run's log
  test::write_file(out / kRunLockName, "pid 1");
  EXPECT_TRUE(find_previous_run(out, ck).empty());

  test::write_file(out / "metrics.jsonl", "{\"type\":\"header\"}\n{\"step\":1,\"type\":\"step\"}\n"
                                          "{\"step\":2,\"type\":\"step\"}\n{\"type\":\"summary\"}\n");
  test::write_file(out / "trace.rank0.json", "[]");
  for (const char* f : {"step-00000002.h5", "step-00000002.h5.digest", "step-00000004.h5", "step-00000004.h5.digest",
                        "latest", ".step-00000006.h5.tmp"})
    test::write_file(ck / f, "x");
  test::write_file(ck / "notes.txt", "the user's own file");
  const PreviousRun previous = find_previous_run(out, ck);
  EXPECT_EQ(previous.describe(), "metrics.jsonl with 2 steps, 2 checkpoints (newest: step 4)");
  EXPECT_EQ(previous.files.size(), 8u);
  remove_previous_run(previous);
  EXPECT_TRUE(find_previous_run(out, ck).empty());
  EXPECT_TRUE(fs::exists(ck / "notes.txt")) << "only fsdpq's own files are removed";
  EXPECT_TRUE(fs::exists(out / "adapter_config.json"));
}

TEST(RunDirectory, AContinuedRunSupersedesTheRecordsOfTheStepsItRedoes) {
  const fs::path metrics = test::make_temp_dir("supersede") / "metrics.jsonl";
  // Steps 1-5 of a run killed while writing a record after step 5's; it continues from step 3.
  std::string text = "{\"type\":\"header\",\"config\":{}}\n";
  for (int s = 1; s <= 5; ++s)
    text += "{\"loss\":1.5,\"step\":" + std::to_string(s) + ",\"type\":\"step\"}\n{\"at\":\"after_optimizer\",\"step\":" +
            std::to_string(s) + ",\"type\":\"memory\"}\n";
  text += "{\"eval_loss\":2,\"step\":5,\"type\":\"eval\"}\n{\"steps\":5,\"type\":\"summary\"}\n{\"loss\":1.2,\"st";
  test::write_file(metrics, text);

  EXPECT_EQ(supersede_records_after(metrics, 3), 4);  // steps 4 and 5, the eval and the summary
  std::vector<std::string> types;
  for (const auto& r : records(metrics)) {
    types.push_back(r.at("type").get<std::string>());
    if (r.at("type") == "superseded") {
      EXPECT_GT(r.value("step", r.value("steps", 0)), 3) << r;
      EXPECT_EQ(r.at("superseded_by_resume_from_step"), 3) << r;
    }
  }
  EXPECT_EQ(types, (std::vector<std::string>{"header", "step", "memory", "step", "memory", "step", "memory",
                                             "superseded", "memory", "superseded", "memory", "superseded",
                                             "superseded"}))
      << "the cut-off last line is dropped, memory records are kept";
  const nlohmann::json step4 = records(metrics)[7];
  EXPECT_EQ(step4.at("superseded_type"), "step");
  EXPECT_EQ(step4.at("loss"), 1.5) << "the fields are kept";

  // Idempotent, and a missing file has nothing to supersede.
  EXPECT_EQ(supersede_records_after(metrics, 3), 0);
  EXPECT_EQ(supersede_records_after(metrics.parent_path() / "none.jsonl", 0), 0);
  EXPECT_FALSE(fs::exists(metrics.parent_path() / "none.jsonl"));
}

// A full disk says so (/dev/full fails every write with ENOSPC), not "disk full?" or "internal error".
TEST(RunDirectory, AFullDiskIsNamedAsTheCauseOfAFailedWrite) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full on this machine";
  MetricsLog metrics("/dev/full", /*append=*/true);
  EXPECT_EQ(error_of([&] { metrics.write({{"type", "step"}}); }),
            "cannot write to the metrics file '/dev/full': No space left on device");
}

}  // namespace
}  // namespace fsdpq
