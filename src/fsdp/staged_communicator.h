// The collectives interface over buffers on a device, carried by a communicator of host buffers
// (MPI): each operation copies its input into host memory, runs there, and copies its result
// back into the caller's buffer when waited for. The CUDA backend uses it where NCCL cannot run:
// ranks sharing one GPU (FSDPQ_SHARE_GPUS=1, which NCCL refuses) or FSDPQ_COLLECTIVES=mpi. That
// makes the FSDP engine's device-buffer path the same code under both transports, and testable
// on one GPU. Slow by design (every byte crosses PCIe twice): a fallback and a test, not a
// transport to train on many GPUs with.
#pragma once
#include <memory>

#include "backend/tensor.h"
#include "fsdp/collectives.h"

namespace fsdpq {

// Buffers passed to the returned communicator live on `device` (Device::CPU: ordinary host
// memory, which the CPU-only tests use to run this same code).
std::unique_ptr<Communicator> make_staged_communicator(std::unique_ptr<Communicator> host, Device device);

}  // namespace fsdpq
