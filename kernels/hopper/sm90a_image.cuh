// Whether this process can run a kernel built for sm_90a alone (the `*_sm90a.cu` files:
// CMakeLists.txt builds them for that architecture only, machine code without PTX, which runs on
// compute capability 9.0 alone). Host code.
#pragma once
#include <string>

namespace fsdpq::cuda::hopper {

// "" when the current GPU is compute capability 9.0 and `kernel`'s sm_90a image loads there, else
// why not (for the caller's one-time message). `kernel`: a __global__ function's address.
std::string sm90a_unavailable(const void* kernel);

}  // namespace fsdpq::cuda::hopper
