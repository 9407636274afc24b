#include "ops/cuda/attention_wgmma.h"

#include <fmt/format.h>

#include <mutex>
#include <set>
#include <string>

#include "kernels/attention_sm90a.cuh"
#include "ops/cuda/kernel_args.h"
#include "runtime/log.h"

namespace fsdpq::cuda_ops {
namespace {

struct RouteState {
  std::mutex mutex;
  WgmmaAttentionCounts counts;
  std::set<std::string> logged;  // reasons already told
};

RouteState& state() {
  static RouteState s;
  return s;
}

void count_ran() {
  RouteState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  ++s.counts.forward_ran;
}

// Counts a declined call and logs its reason the first time it comes up.
bool decline(const std::string& why) {
  RouteState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  ++s.counts.forward_declined;
  if (s.logged.insert(why).second)
    log::warn("attention forward runs on the mma kernels, not the wgmma one: {}", why);
  return false;
}

// Why these operands are not for the kernel ("" when they are).
std::string why_not(const TensorView& out, const TensorView& lse, const TensorView& q, const TensorView& k,
                    const TensorView& v) {
  constexpr const char* op = "attention_forward";
  if (const std::string& why = cuda::attention_sm90a_unavailable(); !why.empty()) return why;
  if (!cuda::attention_sm90a_supported(ktype(op, q), ktype(op, k), ktype(op, v), ktype(op, out), q.shape[3]))
    return fmt::format("q, k, v, out are {}, {}, {}, {} with head dim {}; it takes them all BF16 or all F16, head "
                       "dim 64 or 128",
                       dtype_name(q.dtype), dtype_name(k.dtype), dtype_name(v.dtype), dtype_name(out.dtype),
                       q.shape[3]);
  for (const TensorView* x : {&out, &lse, &q, &k, &v})
    if (!cuda::attention_sm90a_aligned(x->data)) return "an operand is not 16-byte aligned";
  return "";
}

}  // namespace

bool wgmma_attention_forward(const TensorView& out, const TensorView& lse, const TensorView& q, const TensorView& k,
                             const TensorView& v) {
  if (const std::string why = why_not(out, lse, q, k, v); !why.empty()) return decline(why);
  cuda::attention_sm90a_forward(out.data, lse.as<float>(), q.data, k.data, v.data, ktype("attention_forward", q),
                                q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3], cuda::stream());
  count_ran();
  return true;
}

WgmmaAttentionCounts wgmma_attention_counts() {
  RouteState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.counts;
}

}  // namespace fsdpq::cuda_ops
