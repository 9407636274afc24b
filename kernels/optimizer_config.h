// Which optimizer steps the parameters, and its hyperparameters: one definition that the host
// optimizer (src/optim/optimizer.h) and the CUDA kernels (kernels/optimizer.cuh) both take, so
// neither side keeps a mirror of the other. Plain C++17: the kernels build as C++17.
#pragma once

namespace fsdpq {

enum class OptimizerKind { adamw, adam, sgd, adadelta };

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::adamw;
  double lr = 1e-5;  // base learning rate; a schedule scales it per step
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-5;
  double weight_decay = 0.1;  // decoupled for adamw, L2 (added to the gradient) otherwise
  double rho = 0.9;           // adadelta only
};

}  // namespace fsdpq
