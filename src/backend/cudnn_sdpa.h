// Causal grouped-query attention on cuDNN's fused flash-attention kernels, through cudnn-frontend's
// graph API (Graph::sdpa and Graph::sdpa_backward), on fsdpq's layouts: q, out, dout, dq
// [B, T, H, D]; k, v, dk, dv [B, T, KV, D] (query head h reads kv head h / (H / KV)); lse fp32
// [B, H, T]; scale 1 / sqrt(D); query t sees keys 0..t. Every 16-bit operand has the one storage
// type of the shape (cuDNN's kernels take BF16 or F16 in and out; fp32 softmax and accumulation).
//
// One graph per shape and pass, built at its first call and kept for the process (building takes
// cuDNN's heuristics tens of milliseconds; a training run has a handful of shapes). A shape cuDNN
// refuses is remembered too, so it is asked once. Work runs on the compute stream; the workspace
// comes from the caching allocator.
//
// lse: cuDNN's softmax "stats" are max + log Σ exp over each query row's scaled scores, natural
// log — fsdpq's lse exactly, so either backward (cuDNN's or fsdpq's own kernels) reads the other's.
#pragma once
#include <cstdint>
#include <string>

namespace fsdpq::cudnn {

enum class SdpaType { BF16, F16 };

struct SdpaShape {
  int64_t B = 0, T = 0, H = 0, KV = 0, D = 0;
  SdpaType type = SdpaType::BF16;
  auto operator<=>(const SdpaShape&) const = default;
  std::string to_string() const;  // "B2 T512 H32 KV8 D128 BF16"
};

// cuDNN's deterministic backward orders its dQ sums; the other accumulates dQ with fp32 atomics
// (faster, and its bits vary from run to run).
enum class SdpaBackward { Deterministic, Nondeterministic };

// "" when cuDNN runs this pass, else why not: cuDNN is missing (cudnn_library.h), refuses the shape
// (its support check), or the graph breaks fsdpq's memory rule (backward only, below).
std::string why_not_sdpa_forward(const SdpaShape& shape);
std::string why_not_sdpa_backward(const SdpaShape& shape, SdpaBackward algorithm);

// Queue the pass on the compute stream. Calling one whose why_not_* is not "" is a logic_error; a
// failure of cuDNN at run time is a runtime_error naming the shape.
void sdpa_forward(const SdpaShape& shape, void* out, float* lse, const void* q, const void* k, const void* v);
void sdpa_backward(const SdpaShape& shape, SdpaBackward algorithm, void* dq, void* dk, void* dv, const void* dout,
                   const void* q, const void* k, const void* v, const void* out, const float* lse);

// fsdpq's memory rule: nothing in global memory grows with T², so no [T, T] score matrix. cuDNN's
// linear backward needs an fp32 dQ accumulator and a row sum (B·H·T·(D + 1) floats); a backward
// graph whose workspace is over twice that plus 64 MiB is refused. And cuDNN's deterministic
// backward on Hopper (compute capability 9.x) is refused outright: with cudnn-frontend 1.26 it
// keeps dP, a [T, T] matrix per (b, h), in its workspace at every T (a workspace linear in T
// needs cuDNN 9.25 and cudnn-frontend 1.27).
int64_t sdpa_backward_workspace_limit(const SdpaShape& shape);

// The backward graph's workspace as cuDNN builds it, before the memory rule, for the tests that
// check the rule's premises; bytes < 0 with the reason when cuDNN refuses the graph itself.
struct GraphWorkspace {
  int64_t bytes = -1;
  std::string why_not;
};
GraphWorkspace sdpa_backward_workspace(const SdpaShape& shape, SdpaBackward algorithm);

}  // namespace fsdpq::cudnn
