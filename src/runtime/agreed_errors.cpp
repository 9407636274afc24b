#include "runtime/agreed_errors.h"

#include <new>
#include <vector>

#include "runtime/exit_codes.h"
#include "runtime/watchdog.h"
#include "runtime/host_out_of_memory.h"
#include "util/error.h"

namespace fsdpq {

void run_on_all_ranks(const World& world, const std::function<void()>& step) {
  std::string message;
  int exit_code = kExitOk;
  try {
    step();
  } catch (const AgreedError&) {
    throw;  // already agreed by a nested call
  } catch (const UserError& e) {
    message = e.what();
    exit_code = kExitUserError;
  } catch (const std::bad_alloc&) {  // a size the user chose (model, batch, data) that the host cannot hold
    message = out_of_host_memory_message();
    exit_code = kExitUserError;
  } catch (const std::exception& e) {
    message = std::string("internal error: ") + e.what();
    exit_code = kExitInternalError;
  }
  if (world.size == 1) {
    if (exit_code != kExitOk) throw AgreedError(message, exit_code, world.rank);
    return;
  }
  const WaitScope waiting("agreeing with the other ranks on a start-up step");
  int candidate = exit_code != kExitOk ? world.rank : world.size;
  int first_failed = world.size;
  MPI_Allreduce(&candidate, &first_failed, 1, MPI_INT, MPI_MIN, world.comm);
  if (first_failed == world.size) return;
  int header[2] = {exit_code, static_cast<int>(message.size())};
  MPI_Bcast(header, 2, MPI_INT, first_failed, world.comm);
  std::vector<char> text(message.begin(), message.end());
  text.resize(header[1]);
  MPI_Bcast(text.data(), header[1], MPI_CHAR, first_failed, world.comm);
  throw AgreedError(std::string(text.begin(), text.end()), header[0], first_failed);
}

}  // namespace fsdpq
