#include "fsdp/device_collectives.h"

#include <mpi.h>

#include <cstdlib>
#include <string_view>

#include "backend/cuda_backend.h"
#include "fsdp/nccl_communicator.h"
#include "fsdp/staged_communicator.h"
#include "runtime/agreed_errors.h"
#include "util/error.h"

namespace fsdpq {

const char* device_transport_name(DeviceTransport transport) {
  return transport == DeviceTransport::Nccl ? "nccl" : "mpi";
}

DeviceTransport choose_device_transport(const char* env, const GpuInfo& gpu) {
  const std::string_view value = env ? env : "";
  if (value == "mpi") return DeviceTransport::StagedMpi;
  if (value != "" && value != "nccl")
    fail("FSDPQ_COLLECTIVES = '{}': expected nccl or mpi (or unset: nccl, or mpi where ranks share a GPU)", value);
  const bool asked = value == "nccl";
  if (!nccl_available()) {
    if (asked) fail("FSDPQ_COLLECTIVES = nccl, but this fsdpq was built without NCCL");
    return DeviceTransport::StagedMpi;
  }
  if (gpu.shared) {
    if (asked)
      fail("FSDPQ_COLLECTIVES = nccl, but ranks share GPU {} (FSDPQ_SHARE_GPUS=1) and NCCL needs one GPU per rank; "
           "use FSDPQ_COLLECTIVES=mpi or one rank per GPU", gpu.device);
    return DeviceTransport::StagedMpi;
  }
  return DeviceTransport::Nccl;
}

namespace {

// `sub` for a group of more than one rank; nothing for one (there is nothing to communicate).
std::unique_ptr<Communicator> device_group(MPI_Comm sub, int size, const char* name, DeviceTransport transport,
                                           const GpuInfo& gpu) {
  if (size <= 1) return nullptr;
  if (transport == DeviceTransport::Nccl) return make_nccl_communicator(sub, name, gpu.device, cuda_compute_stream());
  return make_staged_communicator(make_mpi_communicator(sub, name), Device::CUDA);
}

}  // namespace

DeviceTransport add_device_collectives(ProcessGroups& groups, const World& world, const GpuInfo& gpu) {
  DeviceTransport mine = DeviceTransport::Nccl;
  run_on_all_ranks(world, [&] { mine = choose_device_transport(std::getenv("FSDPQ_COLLECTIVES"), gpu); });
  // One rank that must stage (a node whose ranks share a GPU) makes every rank stage.
  const bool staged = groups.world->any(mine == DeviceTransport::StagedMpi);
  const DeviceTransport transport = staged ? DeviceTransport::StagedMpi : DeviceTransport::Nccl;
  // The splits first, on every rank (they cannot fail); then the communicators, whose errors
  // (NCCL's start-up) every rank learns.
  MPI_Comm shard, replicate;
  MPI_Comm_split(world.comm, groups.shard_color, world.rank, &shard);
  MPI_Comm_split(world.comm, groups.replicate_color, world.rank, &replicate);
  run_on_all_ranks(world, [&] {
    groups.shard_device = device_group(shard, groups.shard->size(), "shard", transport, gpu);
    groups.replicate_device = device_group(replicate, groups.replicate->size(), "replicate", transport, gpu);
  });
  MPI_Comm_free(&shard);
  MPI_Comm_free(&replicate);
  return transport;
}

}  // namespace fsdpq
