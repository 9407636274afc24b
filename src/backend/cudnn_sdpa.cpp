#include "backend/cudnn_sdpa.h"

#include <fmt/format.h>

namespace fsdpq::cudnn {

std::string SdpaShape::to_string() const {
  return fmt::format("B{} T{} H{} KV{} D{} {}", B, T, H, KV, D, type == SdpaType::BF16 ? "BF16" : "F16");
}

int64_t sdpa_backward_workspace_limit(const SdpaShape& s) {
  const int64_t linear_floats = s.B * s.H * s.T * (s.D + 1);
  return 2 * linear_floats * static_cast<int64_t>(sizeof(float)) + (int64_t{64} << 20);
}

}  // namespace fsdpq::cudnn

#ifdef FSDPQ_WITH_CUDA
// The one translation unit that sees cudnn-frontend: every cuDNN call goes through the library
// that cudnn_library.cpp opens (no link-time dependency on libcudnn).
#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#include <cudnn_frontend.h>

#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

#include "backend/cuda_backend.h"
#include "backend/cudnn_library.h"
#include "backend/tensor.h"

namespace fsdpq::cudnn {
namespace {

namespace fe = cudnn_frontend;
using GraphPtr = std::shared_ptr<fe::graph::Graph>;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

// The operands' ids in a graph's variant pack.
enum Uid : int64_t { kQ = 1, kK, kV, kOut, kLse, kDout, kDq, kDk, kDv };

enum class Pass { Forward, BackwardDeterministic, BackwardNondeterministic };

Pass backward_pass(SdpaBackward algorithm) {
  return algorithm == SdpaBackward::Deterministic ? Pass::BackwardDeterministic : Pass::BackwardNondeterministic;
}

// A graph ready to execute on `handle`, or why cuDNN refused to build it.
struct BuiltGraph {
  GraphPtr graph;
  cudnnHandle_t handle = nullptr;
  int64_t workspace_bytes = 0;
  std::string why_not;
};

float attention_scale(int64_t D) { return 1.0f / std::sqrt(static_cast<float>(D)); }  // as the CPU op

// fsdpq's [B, T, heads, D] memory, in cuDNN's [B, heads, T, D] dimension order.
fe::graph::Tensor_attributes heads_tensor(const char* name, Uid uid, const SdpaShape& s, int64_t heads) {
  return fe::graph::Tensor_attributes()
      .set_name(name)
      .set_uid(uid)
      .set_dim({s.B, heads, s.T, s.D})
      .set_stride({s.T * heads * s.D, s.D, heads * s.D, 1});
}

void set_heads_output(const TensorPtr& t, Uid uid, const SdpaShape& s, int64_t heads) {
  t->set_output(true).set_uid(uid).set_dim({s.B, heads, s.T, s.D}).set_stride({s.T * heads * s.D, s.D, heads * s.D, 1});
}

// lse: fp32 [B, H, T] as cuDNN's [B, H, T, 1].
fe::graph::Tensor_attributes lse_tensor(const SdpaShape& s) {
  return fe::graph::Tensor_attributes()
      .set_name("lse")
      .set_uid(kLse)
      .set_dim({s.B, s.H, s.T, 1})
      .set_stride({s.H * s.T, s.T, 1, 1})
      .set_data_type(fe::DataType_t::FLOAT);
}

GraphPtr new_graph(const SdpaShape& s) {
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(s.type == SdpaType::BF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return graph;
}

// Causal: the band of keys j <= t, aligned at the top left (query t is token t).
template <class Attributes>
void set_causal(Attributes& attributes) {
  attributes.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
}

GraphPtr forward_graph(const SdpaShape& s) {
  GraphPtr graph = new_graph(s);
  TensorPtr q = graph->tensor(heads_tensor("q", kQ, s, s.H));
  TensorPtr k = graph->tensor(heads_tensor("k", kK, s, s.KV));
  TensorPtr v = graph->tensor(heads_tensor("v", kV, s, s.KV));
  auto options = fe::graph::SDPA_attributes().set_name("attention").set_generate_stats(true).set_attn_scale(
      attention_scale(s.D));
  set_causal(options);
  auto [out, stats] = graph->sdpa(q, k, v, options);
  set_heads_output(out, kOut, s, s.H);
  stats->set_output(true).set_uid(kLse).set_data_type(fe::DataType_t::FLOAT).set_dim({s.B, s.H, s.T, 1}).set_stride(
      {s.H * s.T, s.T, 1, 1});
  return graph;
}

GraphPtr backward_graph(const SdpaShape& s, SdpaBackward algorithm) {
  GraphPtr graph = new_graph(s);
  TensorPtr q = graph->tensor(heads_tensor("q", kQ, s, s.H));
  TensorPtr k = graph->tensor(heads_tensor("k", kK, s, s.KV));
  TensorPtr v = graph->tensor(heads_tensor("v", kV, s, s.KV));
  TensorPtr out = graph->tensor(heads_tensor("out", kOut, s, s.H));
  TensorPtr dout = graph->tensor(heads_tensor("dout", kDout, s, s.H));
  TensorPtr lse = graph->tensor(lse_tensor(s));
  auto options = fe::graph::SDPA_backward_attributes()
                     .set_name("attention_backward")
                     .set_attn_scale(attention_scale(s.D))
                     .set_deterministic_algorithm(algorithm == SdpaBackward::Deterministic);
  set_causal(options);
  auto [dq, dk, dv] = graph->sdpa_backward(q, k, v, out, dout, lse, options);
  set_heads_output(dq, kDq, s, s.H);
  set_heads_output(dk, kDk, s, s.KV);
  set_heads_output(dv, kDv, s, s.KV);
  return graph;
}

// "" when the step succeeded, else "<step>: <cuDNN's message>".
std::string failed(const char* step, fe::error_t status) {
  return status.is_good() ? "" : fmt::format("{}: {}", step, status.get_message());
}

// cudnn-frontend's build sequence, stopping at the first refusal: validate the graph, lower it to
// cuDNN's operation graph, ask the heuristics for engines, keep those that support it, build the
// first one's plan.
BuiltGraph build(const SdpaShape& s, Pass pass, const Library& lib) {
  cudnnHandle_t handle = lib.handle;
  BuiltGraph built;
  built.handle = handle;
  try {
    built.graph = pass == Pass::Forward ? forward_graph(s)
                                        : backward_graph(s, pass == Pass::BackwardDeterministic
                                                                ? SdpaBackward::Deterministic
                                                                : SdpaBackward::Nondeterministic);
    fe::graph::Graph& g = *built.graph;
    std::string why = failed("validate", g.validate());
    if (why.empty()) why = failed("operation graph", g.build_operation_graph(handle));
    if (why.empty()) why = failed("heuristics", g.create_execution_plans({fe::HeurMode_t::A}));
    if (why.empty()) why = failed("support check", g.check_support(handle));
    if (why.empty()) why = failed("plan build", g.build_plans(handle));
    if (why.empty()) why = failed("workspace size", g.get_workspace_size(built.workspace_bytes));
    built.why_not = why;
  } catch (const std::exception& e) {  // cudnn-frontend throws from some checks (no implementation found)
    built.why_not = e.what();
  }
  if (!built.why_not.empty()) {
    built.graph.reset();
    built.why_not = fmt::format("cuDNN {} refuses the {} graph of {}: {}", version_text(lib.version),
                                pass == Pass::Forward ? "attention forward" : "attention backward", s.to_string(),
                                built.why_not);
  }
  return built;
}

// Graphs by shape and pass, built once.
class GraphCache {
 public:
  const BuiltGraph& get(const SdpaShape& s, Pass pass) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = graphs_.find({s, pass});
    if (it != graphs_.end()) return it->second;
    BuiltGraph built;
    std::string why_no_library;
    if (const Library* lib = library(&why_no_library)) {
      built = build(s, pass, *lib);
    } else {
      built.why_not = why_no_library;
    }
    return graphs_.emplace(std::make_pair(s, pass), std::move(built)).first->second;
  }

 private:
  std::mutex mutex_;
  std::map<std::pair<SdpaShape, Pass>, BuiltGraph> graphs_;  // node-based: references stay valid
};

GraphCache& graphs() {
  static GraphCache cache;
  return cache;
}

int compute_capability_major() {
  static const int major = [] {
    int value = 0;
    cuda::check(cudaDeviceGetAttribute(&value, cudaDevAttrComputeCapabilityMajor, cuda::device()),
                "compute capability");
    return value;
  }();
  return major;
}

// The memory rule (cudnn_sdpa.h), known before any graph is built: cuDNN's deterministic backward
// on Hopper keeps dP in its workspace (GpuOpsAttentionCudnn.DeterministicBackwardOnHopperHoldsATxTMatrix
// checks that premise).
std::string breaks_memory_rule(SdpaBackward algorithm) {
  if (algorithm == SdpaBackward::Deterministic && compute_capability_major() == 9)
    return "cuDNN's deterministic attention backward on Hopper keeps dP, a [T, T] matrix per head, in its "
           "workspace; the deterministic backward stays on fsdpq's kernels (FSDPQ_ATTENTION=cudnn-nondeterministic "
           "takes cuDNN's faster non-deterministic one)";
  return "";
}

// The memory rule for the workspace of a backward graph cuDNN accepts.
std::string breaks_memory_rule(const SdpaShape& s, int64_t workspace_bytes) {
  const int64_t limit = sdpa_backward_workspace_limit(s);
  if (workspace_bytes <= limit) return "";
  return fmt::format("cuDNN's attention backward of {} wants a {:.1f} MiB workspace, over the {:.1f} MiB a "
                     "workspace linear in T needs: it would hold a [T, T] matrix",
                     s.to_string(), workspace_bytes / 1048576.0, limit / 1048576.0);
}

// The workspace for one execution, from the caching allocator (freed after the call is queued:
// the allocator is ordered by the compute stream).
Tensor workspace_for(const BuiltGraph& built) {
  if (built.workspace_bytes <= 0) return Tensor();
  return Tensor::empty(Shape{built.workspace_bytes}, DType::U8, Device::CUDA);
}

void execute(const BuiltGraph& built, std::unordered_map<int64_t, void*>& pack, const char* pass,
             const SdpaShape& s) {
  Tensor workspace = workspace_for(built);
  fe::error_t status =
      built.graph->execute(built.handle, pack, workspace.defined() ? workspace.view().data : nullptr);
  if (status.is_bad())
    throw std::runtime_error(fmt::format("cuDNN attention {} of {}: {}", pass, s.to_string(), status.get_message()));
}

void* writable(const void* p) { return const_cast<void*>(p); }  // cuDNN's variant pack takes void*

}  // namespace

std::string why_not_sdpa_forward(const SdpaShape& s) { return graphs().get(s, Pass::Forward).why_not; }

std::string why_not_sdpa_backward(const SdpaShape& s, SdpaBackward algorithm) {
  std::string why;
  if (library(&why) == nullptr) return why;
  why = breaks_memory_rule(algorithm);
  if (!why.empty()) return why;
  const BuiltGraph& built = graphs().get(s, backward_pass(algorithm));
  if (!built.why_not.empty()) return built.why_not;
  return breaks_memory_rule(s, built.workspace_bytes);
}

GraphWorkspace sdpa_backward_workspace(const SdpaShape& s, SdpaBackward algorithm) {
  const BuiltGraph& built = graphs().get(s, backward_pass(algorithm));
  if (!built.why_not.empty()) return GraphWorkspace{-1, built.why_not};
  return GraphWorkspace{built.workspace_bytes, ""};
}

void sdpa_forward(const SdpaShape& s, void* out, float* lse, const void* q, const void* k, const void* v) {
  const BuiltGraph& built = graphs().get(s, Pass::Forward);
  if (!built.why_not.empty()) throw std::logic_error("sdpa_forward called where cuDNN refuses: " + built.why_not);
  std::unordered_map<int64_t, void*> pack = {
      {kQ, writable(q)}, {kK, writable(k)}, {kV, writable(v)}, {kOut, out}, {kLse, lse}};
  execute(built, pack, "forward", s);
}

void sdpa_backward(const SdpaShape& s, SdpaBackward algorithm, void* dq, void* dk, void* dv, const void* dout,
                   const void* q, const void* k, const void* v, const void* out, const float* lse) {
  const std::string why = why_not_sdpa_backward(s, algorithm);
  if (!why.empty()) throw std::logic_error("sdpa_backward called where cuDNN is not used: " + why);
  std::unordered_map<int64_t, void*> pack = {{kQ, writable(q)},       {kK, writable(k)},     {kV, writable(v)},
                                             {kOut, writable(out)},   {kLse, writable(lse)}, {kDout, writable(dout)},
                                             {kDq, dq},               {kDk, dk},             {kDv, dv}};
  execute(graphs().get(s, backward_pass(algorithm)), pack, "backward", s);
}

}  // namespace fsdpq::cudnn

#endif  // FSDPQ_WITH_CUDA
