// Host memory: what this process may still allocate (MemAvailable and the cgroup limit, read from
// fixture files and from this machine), whether a run's predicted need fits it, and running out of
// host memory as a user error that says how much, for what and while doing what.
#include <gtest/gtest.h>

#include <unistd.h>

#include <new>

#include "app/host_memory_check.h"
#include "backend/tensor.h"
#include "config/train_config.h"
#include "runtime/agreed_errors.h"
#include "runtime/available_memory.h"
#include "runtime/exit_codes.h"
#include "runtime/host_out_of_memory.h"
#include "test_support.h"

namespace fsdpq {
namespace {

namespace fs = std::filesystem;
constexpr int64_t kGiB = int64_t{1} << 30;

// A fake machine under a temp folder: /proc/meminfo, /proc/self/{cgroup,mountinfo} and cgroup files.
class FakeHost {
 public:
  FakeHost() : root_(test::make_temp_dir("fakehost")) {}
  const fs::path& root() const { return root_; }
  void write(const std::string& path, const std::string& text) const {
    fs::create_directories((root_ / path).parent_path());
    test::write_file(root_ / path, text);
  }
  void meminfo_available_kib(int64_t kib) const {
    write("proc/meminfo", fmt::format("MemTotal:       98765432 kB\nMemFree:         1234 kB\nMemAvailable:   {} kB\n", kib));
  }

 private:
  fs::path root_;
};

// This machine's kind of lines (a container on cgroup v1) and a systemd host on cgroup v2.
constexpr const char* kV1Cgroup = "9:name=systemd:/\n4:memory:/process_api/6e96\n1:cpu:/\n0::/\n";
constexpr const char* kV1Mounts =
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n";
constexpr const char* kV2Cgroup = "0::/system.slice/slurmstepd.scope/job_7/step_0\n";
constexpr const char* kV2Mounts =
    "22 1 0:21 / / rw - ext4 /dev/root rw\n"
    "25 22 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n";

TEST(AvailableMemory, ParsesMemAvailable) {
  EXPECT_EQ(parse_mem_available("MemTotal: 24683784 kB\nMemAvailable:   23221792 kB\nSwapFree: 0 kB\n"),
            int64_t{23221792} * 1024);
  EXPECT_EQ(parse_mem_available("MemTotal: 24683784 kB\nMemFree: 1 kB\n"), std::nullopt) << "kernels before 3.14";
  EXPECT_EQ(parse_mem_available("MemAvailable: lots\n"), std::nullopt);
}

TEST(AvailableMemory, FindsTheMemoryCgroupOnV1AndV2) {
  std::vector<CgroupDir> v1 = memory_cgroup_dirs(kV1Cgroup, kV1Mounts);
  ASSERT_EQ(v1.size(), 1u);
  EXPECT_EQ(v1[0].version, 1);
  EXPECT_EQ(v1[0].dir, "/sys/fs/cgroup/memory/process_api/6e96");
  EXPECT_EQ(v1[0].mount, "/sys/fs/cgroup/memory");

  std::vector<CgroupDir> v2 = memory_cgroup_dirs(kV2Cgroup, kV2Mounts);
  ASSERT_EQ(v2.size(), 1u);
  EXPECT_EQ(v2[0].version, 2);
  EXPECT_EQ(v2[0].dir, "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_7/step_0");

  // A container whose cgroup mount shows only its own subtree (the mount's root is its cgroup).
  const std::string namespaced = "30 20 0:26 /kubepods/pod1/c1 /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n";
  EXPECT_EQ(memory_cgroup_dirs("0::/kubepods/pod1/c1/sub\n", namespaced).at(0).dir, "/sys/fs/cgroup/sub");
  EXPECT_EQ(memory_cgroup_dirs("0::/\n", namespaced).at(0).dir, "/sys/fs/cgroup") << "a cgroup namespace";
  // A path with a space, escaped in mountinfo as \040.
  EXPECT_EQ(memory_cgroup_dirs("0::/a\n", "1 0 0:1 / /mnt/my\\040cgroups rw - cgroup2 none rw\n").at(0).dir,
            "/mnt/my cgroups/a");
  EXPECT_TRUE(memory_cgroup_dirs("0::/\n", "1 0 0:1 / / rw - ext4 /dev/sda rw\n").empty()) << "no cgroup mount";
}

TEST(AvailableMemory, TheTightestCgroupLevelCountsAndDroppableCacheIsFree) {
  FakeHost host;
  host.meminfo_available_kib(20 * 1024 * 1024);  // 20 GiB
  host.write("proc/self/cgroup", kV2Cgroup);
  host.write("proc/self/mountinfo", kV2Mounts);
  const std::string job = "sys/fs/cgroup/system.slice/slurmstepd.scope/job_7";
  host.write(job + "/memory.max", std::to_string(8 * kGiB) + "\n");
  host.write(job + "/memory.current", std::to_string(3 * kGiB) + "\n");
  host.write(job + "/memory.stat", "anon 1\nfile 1073741824\nactive_file 536870912\ninactive_file 536870912\n");
  host.write(job + "/step_0/memory.max", "max\n");  // the step sets no limit of its own
  host.write(job + "/step_0/memory.current", std::to_string(3 * kGiB) + "\n");
  host.write("sys/fs/cgroup/system.slice/memory.max", std::to_string(100 * kGiB) + "\n");
  host.write("sys/fs/cgroup/system.slice/memory.current", std::to_string(50 * kGiB) + "\n");

  const AvailableMemory m = read_available_memory(host.root());
  EXPECT_EQ(m.mem_available, 20 * kGiB);
  ASSERT_TRUE(m.cgroup.has_value());
  EXPECT_EQ(m.cgroup->dir, "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_7");
  EXPECT_EQ(m.cgroup->limit, 8 * kGiB);
  EXPECT_EQ(m.cgroup->in_use, 2 * kGiB) << "3 GiB used, of which 1 GiB page cache it can drop";
  EXPECT_EQ(m.bytes(), 6 * kGiB);
  EXPECT_EQ(m.describe(),
            "6.00 GiB (MemAvailable 20.00 GiB; cgroup /sys/fs/cgroup/system.slice/slurmstepd.scope/job_7: limit 8.00 "
            "GiB, 2.00 GiB in use)");
}

TEST(AvailableMemory, CgroupV1LimitsAndTheUnlimitedValue) {
  FakeHost host;
  host.write("proc/self/cgroup", kV1Cgroup);
  host.write("proc/self/mountinfo", kV1Mounts);
  const std::string mine = "sys/fs/cgroup/memory/process_api/6e96";
  host.write(mine + "/memory.limit_in_bytes", "9223372036854771712\n");  // v1's "no limit"
  host.write(mine + "/memory.usage_in_bytes", "256667648\n");
  host.write("sys/fs/cgroup/memory/process_api/memory.limit_in_bytes", std::to_string(4 * kGiB) + "\n");
  host.write("sys/fs/cgroup/memory/process_api/memory.usage_in_bytes", std::to_string(kGiB) + "\n");
  host.write("sys/fs/cgroup/memory/process_api/memory.stat",
             "cache 5\nactive_file 1\ninactive_file 2\ntotal_active_file 268435456\ntotal_inactive_file 268435456\n");
  const AvailableMemory m = read_available_memory(host.root());
  EXPECT_EQ(m.mem_available, std::nullopt) << "no meminfo in this fixture";
  ASSERT_TRUE(m.cgroup.has_value());
  EXPECT_EQ(m.cgroup->dir, "/sys/fs/cgroup/memory/process_api");
  EXPECT_EQ(m.cgroup->in_use, kGiB / 2) << "the hierarchical total_ figures, as usage_in_bytes is";
  EXPECT_EQ(m.bytes(), 4 * kGiB - kGiB / 2);

  // Nothing limited and no meminfo: unknown.
  FakeHost bare;
  bare.write("proc/self/cgroup", kV1Cgroup);
  bare.write("proc/self/mountinfo", kV1Mounts);
  bare.write(mine + "/memory.limit_in_bytes", "9223372036854771712\n");
  bare.write(mine + "/memory.usage_in_bytes", "1\n");
  const AvailableMemory none = read_available_memory(bare.root());
  EXPECT_FALSE(none.cgroup.has_value());
  EXPECT_EQ(none.bytes(), std::nullopt);
  EXPECT_EQ(none.describe(), "unknown (no /proc/meminfo MemAvailable, no cgroup memory limit)");
}

// The same code on this machine's own files.
TEST(AvailableMemory, ReadsThisMachine) {
  if (!fs::exists("/proc/meminfo")) GTEST_SKIP() << "no /proc/meminfo (not Linux)";
  const AvailableMemory m = read_available_memory("/");
  ASSERT_TRUE(m.mem_available.has_value()) << "Linux has had MemAvailable since 3.14";
  const int64_t total = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  EXPECT_GT(*m.mem_available, 0);
  EXPECT_LE(*m.mem_available, total);
  if (m.cgroup) {
    EXPECT_GT(m.cgroup->limit, 0) << m.describe();
    EXPECT_TRUE(fs::exists(m.cgroup->dir)) << m.describe();
  }
  EXPECT_LE(*m.bytes(), *m.mem_available);
  // The memory cgroup folders this process's own files lead to exist.
  for (const CgroupDir& d : memory_cgroup_dirs(test::read_file("/proc/self/cgroup"), test::read_file("/proc/self/mountinfo")))
    EXPECT_TRUE(fs::is_directory(d.dir)) << d.dir;
  EXPECT_EQ(host_root(), std::getenv("FSDPQ_HOST_ROOT") ? fs::path(std::getenv("FSDPQ_HOST_ROOT")) : fs::path("/"));
}

TEST(HostMemoryCheck, RefusesOnlyWhatClearlyCannotFit) {
  HostMemoryDemand d;
  d.tensors_per_rank = 3 * kGiB;
  d.process_per_rank = kGiB;
  d.in_use_per_rank = kGiB / 4;
  d.ranks = 2;
  EXPECT_EQ(d.certain(), 6 * kGiB);
  EXPECT_EQ(d.expected(), 6 * kGiB + 2 * (kGiB - kGiB / 4));
  EXPECT_EQ(judge_host_memory(d, 8 * kGiB), HostMemoryFit::Fits);
  EXPECT_EQ(judge_host_memory(d, 7 * kGiB), HostMemoryFit::MayNotFit) << "the process allowance no longer fits";
  EXPECT_EQ(judge_host_memory(d, 5 * kGiB), HostMemoryFit::MayNotFit) << "within the margin: a warning";
  EXPECT_EQ(judge_host_memory(d, 4 * kGiB), HostMemoryFit::DoesNotFit);
  // The margin's edge: refused only beyond kHostRefuseAbove × available.
  d.ranks = 1;
  d.tensors_per_rank = 5 * kGiB;
  ASSERT_EQ(kHostRefuseAbove, 1.25);
  EXPECT_EQ(judge_host_memory(d, 4 * kGiB), HostMemoryFit::MayNotFit);
  EXPECT_EQ(judge_host_memory(d, 4 * kGiB - 1), HostMemoryFit::DoesNotFit);
  d.in_use_per_rank = 2 * kGiB;  // a rank already holding more than the allowance owes nothing more for it
  EXPECT_EQ(d.expected(), d.certain());
}

TEST(HostMemoryCheck, SaysWhatToChange) {
  TrainConfig c;  // code reads the parsed choices (config resolution sets both)
  c.train_type = "lora";
  c.choice.train_type = TrainType::Lora;
  c.use_cpu_offload = true;
  const std::vector<std::string> gpu = ways_to_lower_host_memory(c, true, 1, 4);
  EXPECT_EQ(gpu.front(), "use_cpu_offload = false (the weights and optimizer state then stay on the GPU)");
  EXPECT_NE(std::find(gpu.begin(), gpu.end(), "train_type = qlora (the frozen weights in 4-bit NF4)"), gpu.end());
  EXPECT_NE(std::find(gpu.begin(), gpu.end(),
                      "sharding_strategy = full_shard (each rank then holds a shard of the model, not all of it)"),
            gpu.end());
  c.train_type = "qlora";
  c.choice.train_type = TrainType::Qlora;
  const std::vector<std::string> cpu = ways_to_lower_host_memory(c, false, 4, 4);
  EXPECT_EQ(cpu.front(), "a smaller batch_size or context_length (the CPU backend keeps the activations in host memory)")
      << "use_cpu_offload means nothing without a GPU";
  EXPECT_EQ(cpu.size(), 3u);  // + fewer ranks per node, more memory
}

TEST(HostOutOfMemory, AHostTensorTooLargeIsAUserErrorSayingHowMuchForWhatAndWhile) {
  const HostMemoryPurpose purpose("testing a tensor of a petabyte");
  try {
    Tensor::empty(Shape{int64_t{1} << 48}, DType::F32, Device::CPU);
    FAIL() << "a petabyte was allocated";
  } catch (const HostOutOfMemory& e) {  // a UserError: exit code 2, as the GPU's DeviceOutOfMemory
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("host out of memory allocating 1024.00 TiB for a host tensor F32[281474976710656] on CPU "
                            "while testing a tensor of a petabyte: available to this process ",
                            0),
              0u)
        << message;
    EXPECT_NE(message.find(". Lower batch_size or context_length, use fewer ranks per node (more nodes), or give the "
                           "job more memory (fsdpq plan --host-mem GiB estimates what fits)"),
              std::string::npos)
        << message;
  }
}

TEST(HostOutOfMemory, AnyBadAllocIsAnAgreedUserErrorWithExitCode2) {
  World world;  // one rank: no MPI needed
  try {
    const HostMemoryPurpose outer("loading");
    const HostMemoryPurpose inner("reading a file");
    run_on_all_ranks(world, [] { throw std::bad_alloc(); });
    FAIL() << "no error";
  } catch (const AgreedError& e) {
    EXPECT_EQ(e.exit_code, kExitUserError);
    EXPECT_EQ(std::string(e.what()).rfind(
                  "host out of memory (std::bad_alloc: an allocation failed) while reading a file: available to this "
                  "process ",
                  0),
              0u)
        << e.what();
  }
  const HostMemoryPurpose after("the purposes above are gone");
  EXPECT_NE(out_of_host_memory_message().find("while the purposes above are gone:"), std::string::npos);
}

}  // namespace
}  // namespace fsdpq
