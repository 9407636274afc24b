// The fp32 constants of one Adam / AdamW step, computed in double and rounded once. The CPU's
// optimizer (src/optim/optimizer.cpp) and the CUDA kernels (kernels/optimizer.cu) both apply
// these, so the two devices step bit for bit alike. Plain C++: built with or without CUDA.
#pragma once
#include <cmath>
#include <cstdint>

namespace fsdpq {

struct AdamScalars {
  bool decoupled = false;  // weight decay on the parameter (AdamW): p *= decay_factor
  bool l2 = false;         // weight decay added to the gradient (Adam): g += l2_weight * p
  float decay_factor = 1.0f, l2_weight = 0.0f, avg_weight = 0.0f, beta2 = 0.0f, sq_weight = 0.0f,
        bias_correction2_sqrt = 1.0f, eps = 0.0f, neg_step_size = 0.0f;
};

// Step `step` (1-based) at learning rate lr, as torch.optim.Adam(W) computes its constants.
inline AdamScalars adam_scalars(double beta1, double beta2, double eps, double weight_decay, bool decoupled_decay,
                                double lr, int64_t step) {
  const double bias_correction1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  const bool decay = weight_decay != 0.0;
  AdamScalars s;
  s.decoupled = decay && decoupled_decay;
  s.l2 = decay && !decoupled_decay;
  s.decay_factor = static_cast<float>(1.0 - lr * weight_decay);
  s.l2_weight = static_cast<float>(weight_decay);
  s.avg_weight = static_cast<float>(1.0 - beta1);
  s.beta2 = static_cast<float>(beta2);
  s.sq_weight = static_cast<float>(1.0 - beta2);
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  s.eps = static_cast<float>(eps);
  s.neg_step_size = static_cast<float>(-(lr / bias_correction1));
  return s;
}

}  // namespace fsdpq
