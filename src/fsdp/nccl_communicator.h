// The NCCL transport of the collectives interface (fsdp/collectives.h): device buffers, the
// communicator's own CUDA stream, completion through CUDA events. The NCCL unique id travels over
// MPI from the group's rank 0. NVLink multicast (NVLS) stays off unless the user set
// NCCL_NVLS_ENABLE: it reserves memory and the lent machines do not allow it.
#pragma once
#include <mpi.h>

#include <memory>
#include <string>

#include "fsdp/collectives.h"

namespace fsdpq {

// True when this build has NCCL (CUDA builds).
bool nccl_available();

// Collective over `comm`: one rank per GPU, each on `device` (its cudaSetDevice index). Every
// operation first waits (on the GPU, not the host) for the work already queued on the stream that
// produced its input, `input_stream` (nullptr: the legacy default stream). Buffers are device
// memory, except that all_reduce and broadcast also accept host memory (staged through the
// device), so the scalar helpers work. wait() blocks the host until the operation is done.
// A UserError without CUDA/NCCL or when NCCL cannot start, with NCCL's reason.
std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, std::string name, int device,
                                                     void* input_stream = nullptr);

}  // namespace fsdpq
