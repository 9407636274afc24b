#include "runtime/world.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "runtime/watchdog.h"
#include "util/strings.h"

namespace fsdpq {
namespace {

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace

std::string detect_launcher() {
  if (!env_or_empty("OMPI_COMM_WORLD_RANK").empty() || !env_or_empty("PMIX_RANK").empty()) {
    // srun with PMIx also sets PMIX_RANK; SLURM_STEP_ID tells srun from mpirun.
    if (!env_or_empty("SLURM_STEP_ID").empty() && !env_or_empty("SLURM_PROCID").empty()) return "srun";
    return "mpirun";
  }
  if (!env_or_empty("SLURM_PROCID").empty() && !env_or_empty("SLURM_STEP_ID").empty()) return "srun";
  return "singleton";
}

World describe_world(const std::string& launcher) {
  World w;
  MPI_Comm_rank(MPI_COMM_WORLD, &w.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &w.size);

  MPI_Comm node_comm;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, w.rank, MPI_INFO_NULL, &node_comm);
  MPI_Comm_rank(node_comm, &w.local_rank);
  MPI_Comm_size(node_comm, &w.local_size);
  // Nodes are numbered by their leaders (local rank 0) in world-rank order; ranks of one node
  // need not be contiguous, so each rank asks its leader for the leader's world rank.
  int leader_rank = w.rank;
  MPI_Bcast(&leader_rank, 1, MPI_INT, 0, node_comm);
  MPI_Comm_free(&node_comm);
  std::vector<int> is_leader(w.size);
  int am_leader = w.local_rank == 0 ? 1 : 0;
  MPI_Allgather(&am_leader, 1, MPI_INT, is_leader.data(), 1, MPI_INT, MPI_COMM_WORLD);
  w.num_nodes = 0;
  for (int r = 0; r < w.size; ++r) {
    if (r == leader_rank) w.node = w.num_nodes;
    w.num_nodes += is_leader[r];
  }

  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  w.hostname = host;
  w.launcher = launcher;
  return w;
}

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  // Read before MPI_Init: a singleton Open MPI sets the same variables as mpirun during init.
  const std::string launcher = detect_launcher();
  int provided = 0;
  // MPI_THREAD_MULTIPLE lets the watchdog thread ask the other ranks' watchdogs what they do; every
  // other MPI call stays on the main thread.
  MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  // Errors come back as codes and are turned into messages, rather than MPI aborting silently.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  world_ = describe_world(launcher);
  start_watchdog(world_, provided >= MPI_THREAD_MULTIPLE);
}

MpiRuntime::~MpiRuntime() {
  stop_watchdog();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void abort_job(const World& world, int exit_code, const std::string& message) {
  if (world.size > 1)
    std::fprintf(stderr, "fsdpq: error on rank %d (%s): %s\n", world.rank, world.hostname.c_str(), message.c_str());
  else
    std::fprintf(stderr, "fsdpq: error: %s\n", message.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  if (world.size > 1) MPI_Abort(MPI_COMM_WORLD, exit_code);
  MPI_Finalize();
  std::exit(exit_code);
}

}  // namespace fsdpq
