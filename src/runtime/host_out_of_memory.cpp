#include "runtime/host_out_of_memory.h"

#include <fmt/format.h>
#include <sys/resource.h>

#include <vector>

#include "runtime/available_memory.h"
#include "util/error.h"
#include "util/strings.h"

namespace fsdpq {

namespace {

std::vector<std::string>& purposes() {
  thread_local std::vector<std::string> stack;
  return stack;
}

// A limit on this process's address space (ulimit -v) fails allocations before memory runs out.
std::string address_space_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return "";
  return fmt::format("; its address space is limited to {} (ulimit -v)", human_bytes(static_cast<double>(limit.rlim_cur)));
}

std::string message_for(const std::string& failure) {
  std::string message = "host out of memory " + failure;
  if (!purposes().empty()) message += " while " + purposes().back();
  return message + fmt::format(
                       ": available to this process {}{}. Lower batch_size or context_length, use fewer ranks per node "
                       "(more nodes), or give the job more memory (fsdpq plan --host-mem GiB estimates what fits)",
                       read_available_memory(host_root()).describe(), address_space_limit());
}

}  // namespace

HostMemoryPurpose::HostMemoryPurpose(std::string what) { purposes().push_back(std::move(what)); }
HostMemoryPurpose::~HostMemoryPurpose() { purposes().pop_back(); }

std::string out_of_host_memory_message(size_t bytes, std::string_view what) {
  return message_for(fmt::format("allocating {} for {}", human_bytes(static_cast<double>(bytes)), what));
}

std::string out_of_host_memory_message() { return message_for("(std::bad_alloc: an allocation failed)"); }

void fail_host_allocation(size_t bytes, std::string_view what) {
  throw HostOutOfMemory(out_of_host_memory_message(bytes, what));
}

}  // namespace fsdpq
