// The MPI world this process belongs to: rank, size, which node, which rank on the node, and
// how it was launched (singleton, mpirun, srun). One World per process, made at start-up.
#pragma once
#include <mpi.h>

#include <string>

namespace fsdpq {

struct World {
  int rank = 0;
  int size = 1;
  int local_rank = 0;  // rank among the processes sharing this node's memory
  int local_size = 1;
  int node = 0;        // index of this node, 0 .. num_nodes-1
  int num_nodes = 1;
  std::string hostname;
  std::string launcher;  // "singleton", "mpirun" or "srun"
  MPI_Comm comm = MPI_COMM_WORLD;

  bool is_root() const { return rank == 0; }
};

// How this process was started, from the environment: "srun", "mpirun" or "singleton".
// Call before MPI_Init (a singleton's MPI_Init sets mpirun's variables).
std::string detect_launcher();
// Describes the world of an initialised MPI (collective over MPI_COMM_WORLD).
World describe_world(const std::string& launcher);

// Starts MPI (MPI_Init_thread asking for MPI_THREAD_MULTIPLE, for the watchdog thread: see
// runtime/watchdog.h) and the watchdog, and fills the World; stops both in the destructor.
class MpiRuntime {
 public:
  MpiRuntime(int* argc, char*** argv);
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;
  const World& world() const { return world_; }

 private:
  World world_;
};

// Ends every rank of the job now, with this exit code, after printing `message` (one line,
// prefixed with this rank). For errors that happen on one rank only; never returns.
[[noreturn]] void abort_job(const World& world, int exit_code, const std::string& message);

}  // namespace fsdpq
