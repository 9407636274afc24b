// Which transport carries the engine's collectives over GPU memory (fsdp/device_collectives.h):
// FSDPQ_COLLECTIVES' values, the default, and the errors that name the variable.
#include <gtest/gtest.h>

#include "fsdp/device_collectives.h"
#include "fsdp/nccl_communicator.h"
#include "test_support.h"

namespace fsdpq {
namespace {

GpuInfo gpu(bool shared) {
  GpuInfo g;
  g.device = 0;
  g.visible_devices = 1;
  g.shared = shared;
  return g;
}

TEST(DeviceTransport, DefaultIsNcclUnlessRanksShareAGpu) {
  const DeviceTransport own = nccl_available() ? DeviceTransport::Nccl : DeviceTransport::StagedMpi;
  EXPECT_EQ(choose_device_transport(nullptr, gpu(false)), own);
  EXPECT_EQ(choose_device_transport("", gpu(false)), own);
  EXPECT_EQ(choose_device_transport(nullptr, gpu(true)), DeviceTransport::StagedMpi);
  EXPECT_EQ(choose_device_transport("mpi", gpu(false)), DeviceTransport::StagedMpi);
  EXPECT_STREQ(device_transport_name(DeviceTransport::Nccl), "nccl");
  EXPECT_STREQ(device_transport_name(DeviceTransport::StagedMpi), "mpi");
}

TEST(DeviceTransport, BadValuesNameTheVariable) {
  EXPECT_EQ(test::error_of([] { choose_device_transport("gloo", gpu(false)); }),
            "FSDPQ_COLLECTIVES = 'gloo': expected nccl or mpi (or unset: nccl, or mpi where ranks share a GPU)");
  if (!nccl_available()) GTEST_SKIP() << "built without NCCL";
  EXPECT_EQ(choose_device_transport("nccl", gpu(false)), DeviceTransport::Nccl);
  EXPECT_EQ(test::error_of([] { choose_device_transport("nccl", gpu(true)); }),
            "FSDPQ_COLLECTIVES = nccl, but ranks share GPU 0 (FSDPQ_SHARE_GPUS=1) and NCCL needs one GPU per rank; use "
            "FSDPQ_COLLECTIVES=mpi or one rank per GPU");
}

}  // namespace
}  // namespace fsdpq
