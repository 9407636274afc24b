// Which transport carries the FSDP engine's collectives over GPU memory — the parameter
// all-gathers and the gradient reduce-scatters / all-reduces — and their creation:
//   nccl  NCCL on its own stream, ordered after the compute stream (fsdp/nccl_communicator.h):
//         how multi-GPU runs train.
//   mpi   MPI staged through host memory (fsdp/staged_communicator.h): for ranks sharing a GPU,
//         which NCCL refuses, and for comparing the two.
// FSDPQ_COLLECTIVES picks one; unset, it is nccl unless ranks share a GPU (FSDPQ_SHARE_GPUS=1).
// Everything else (losses, norms, flags, checkpoints, the shard loader) stays on MPI over host
// buffers: small or rare, and the same on every backend.
#pragma once
#include <string>

#include "fsdp/process_groups.h"
#include "runtime/gpu.h"
#include "runtime/world.h"

namespace fsdpq {

enum class DeviceTransport { Nccl, StagedMpi };
const char* device_transport_name(DeviceTransport transport);  // "nccl", "mpi"

// The transport for this rank from FSDPQ_COLLECTIVES' value (`env`, nullptr when unset) and its
// GPU. A UserError naming FSDPQ_COLLECTIVES for another value, or for nccl where NCCL cannot run
// (a build without it, or ranks sharing a GPU).
DeviceTransport choose_device_transport(const char* env, const GpuInfo& gpu);

// Fills groups.shard_device and groups.replicate_device (groups of more than one rank) with the
// transport every rank agrees on: staged MPI if any rank needs it. Collective over the world;
// returns the transport used.
DeviceTransport add_device_collectives(ProcessGroups& groups, const World& world, const GpuInfo& gpu);

}  // namespace fsdpq
