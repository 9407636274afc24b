#include "fsdp/sharded_training_state.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <new>
#include <stdexcept>
#include <utility>

#include "backend/cuda_backend.h"
#include "model/llama_weights.h"
#include "ops/elementwise.h"
#include "ops/parallel.h"
#include "optim/clip.h"
#include "optim/device_grads.h"
#include "optim/device_optimizer.h"
#include "runtime/host_out_of_memory.h"

namespace fsdpq {
namespace {

// A trainable tensor's place in its unit's flat elements.
struct TrainableSlot {
  std::string name;
  Shape shape;
  int64_t offset = 0, numel = 0;
};

// g *= f over a host gradient shard, multi-threaded (clipping's scale of every gradient).
void scale_host(std::vector<float>& grad, float f) {
  float* g = grad.data();
  const int64_t n = static_cast<int64_t>(grad.size());
#pragma omp parallel for if (worth_parallel(n)) schedule(static)
  for (int64_t i = 0; i < n; ++i) g[i] *= f;
}

}  // namespace

struct ShardedTrainingState::Unit {
  std::vector<TrainableSlot> trainables;
  int64_t trainable_numel = 0, shard_numel = 0;
  int64_t shard_begin = 0;  // this rank's first element of the unit's flat trainable elements

  // With the state on the GPU, master_d / grad_d / device_optimizer hold the shard and `master` is
  // a host staging copy, refreshed where host code reads it (checkpoints, compute copies).
  std::vector<float> master, grad;
  std::unique_ptr<ShardOptimizer> optimizer;
  Tensor master_d, grad_d;
  std::unique_ptr<DeviceShardOptimizer> device_optimizer;

  // `grad` holds zeros: since it was made, zeroed, or stepped with (the fused update zeroes it).
  bool grad_zero = true;
  // write_compute_copies_on_update's buffer, and whether an update wrote it since last asked.
  void* update_compute = nullptr;
  DType update_compute_dtype = DType::BF16;
  bool compute_written = false;
  // The step's gradient where the host-offload worker copied it out (take_gradient) instead of
  // adding it into `grad`, which still holds zeros. Its update reads it there, which saves a write
  // and a read of `grad` and its zeroing (12 of the 46 bytes per parameter the worker moves;
  // bench/RESULTS.md, "CPU offload").
  float* staged_gradient = nullptr;

  bool on_device() const { return device_optimizer != nullptr; }
  float* step_gradient() { return staged_gradient ? staged_gradient : grad.data(); }
  GradBuffer grad_buffer() {
    return on_device() ? GradBuffer{grad_d.data<float>(), grad_d.numel()}
                       : GradBuffer{grad.data(), static_cast<int64_t>(grad.size())};
  }
  void master_to_host() {
    if (on_device())
      copy_bytes(master.data(), Device::CPU, master_d.view().data, Device::CUDA, master.size() * sizeof(float));
  }
  void master_to_device() {
    if (on_device())
      copy_bytes(master_d.view().data, Device::CUDA, master.data(), Device::CPU, master.size() * sizeof(float));
  }
};

ShardedTrainingState::ShardedTrainingState(ProcessGroups& groups, OptimizerConfig optimizer, Device device,
                                           int num_units)
    : groups_(groups), optimizer_(std::move(optimizer)), device_(device) {
  for (int i = 0; i < num_units; ++i) units_.push_back(std::make_unique<Unit>());
}

ShardedTrainingState::~ShardedTrainingState() = default;

ShardedTrainingState::Unit& ShardedTrainingState::unit(int index) {
  if (index < 0 || index >= num_units()) throw std::logic_error(fmt::format("ShardedTrainingState: no unit {}", index));
  return *units_[static_cast<size_t>(index)];
}

const ShardedTrainingState::Unit& ShardedTrainingState::unit(int index) const {
  return const_cast<ShardedTrainingState*>(this)->unit(index);
}

int64_t ShardedTrainingState::trainable_numel(int index) const { return unit(index).trainable_numel; }
int64_t ShardedTrainingState::shard_numel(int index) const { return unit(index).shard_numel; }
bool ShardedTrainingState::is_writer() const { return groups_.replicate->rank() == 0; }

void ShardedTrainingState::adopt(int index, const ParamUnit& contents, const UnitLayout& layout,
                                 std::vector<float> master) {
  Unit& u = unit(index);
  if (master.size() != static_cast<size_t>(layout.shard_numel) ||
      contents.trainable.size() != layout.trainable_offset.size())
    throw std::logic_error(fmt::format("ShardedTrainingState: unit {}'s shard does not match its layout", index));
  for (size_t k = 0; k < contents.trainable.size(); ++k) {
    const TrainableTensor* t = contents.trainable[k];
    u.trainables.push_back({t->name, t->shape, layout.trainable_offset[k], t->shape.numel()});
  }
  u.trainable_numel = layout.trainable_numel;
  u.shard_numel = layout.shard_numel;
  u.shard_begin = layout.trainable_begin(groups_.shard->rank());
  u.master = std::move(master);
  allocate_state(u);
}

void ShardedTrainingState::allocate_state(Unit& u) {
  if (device_ == Device::CUDA) {
    u.master_d = copy_to(TensorView{u.master.data(), DType::F32, Shape{u.shard_numel}, Device::CPU}, Device::CUDA);
    u.grad_d = Tensor::zeros(Shape{u.shard_numel}, DType::F32, Device::CUDA);
    u.device_optimizer = std::make_unique<DeviceShardOptimizer>(optimizer_, u.shard_numel);
    return;
  }
  try {
    u.grad.assign(static_cast<size_t>(u.shard_numel), 0.0f);
    u.optimizer = std::make_unique<ShardOptimizer>(optimizer_, u.shard_numel);
  } catch (const std::bad_alloc&) {
    const size_t buffers = 1 + optimizer_state_names(optimizer_.kind).size();
    fail_host_allocation(buffers * static_cast<size_t>(u.shard_numel) * sizeof(float),
                         fmt::format("the fp32 gradient and {} optimizer state of a shard of {} parameters",
                                     optimizer_kind_name(optimizer_.kind), u.shard_numel));
  }
}

void ShardedTrainingState::add_to_gradient(int index, int64_t offset, const TensorView& values, float scale) {
  Unit& u = unit(index);
  if (u.on_device()) {
    add_scaled(u.grad_d.view().slice_rows(offset, values.numel()), values, scale);
    u.grad_zero = false;
    return;
  }
  float* grad = u.grad.data() + offset;
  const float* add = static_cast<const float*>(values.data);
  const int64_t n = values.numel();
#pragma omp parallel for if (worth_parallel(n)) schedule(static)
  for (int64_t i = 0; i < n; ++i) grad[i] += add[i] * scale;
  u.grad_zero = false;
}

TensorView ShardedTrainingState::gradient_on_device(int index) {
  Unit& u = unit(index);
  if (!u.on_device()) throw std::logic_error("ShardedTrainingState: the gradients live on the host");
  return u.grad_d.view();
}

void ShardedTrainingState::gradient_written(int index) { unit(index).grad_zero = false; }

TensorView ShardedTrainingState::master_on_device(int index) {
  Unit& u = unit(index);
  if (!u.on_device()) throw std::logic_error("ShardedTrainingState: the masters live on the host");
  return u.master_d.view();
}

std::span<const float> ShardedTrainingState::master_on_host(int index) {
  Unit& u = unit(index);
  u.master_to_host();
  return u.master;
}

// ---- The whole step ----------------------------------------------------------------------------

bool ShardedTrainingState::unscale(const DynamicLossScaler& scaler) {
  std::vector<GradBuffer> grads;
  for (auto& u : units_) grads.push_back(u->grad_buffer());
  bool found = false;
  if (on_device()) {
    found = device_unscale(grads, scaler);
  } else {
    for (const GradBuffer& g : grads) found |= scaler.unscale(g.data, g.numel);
  }
  return overflow_anywhere(found);
}

double ShardedTrainingState::grad_norm() {
  std::vector<GradBuffer> grads;
  for (auto& u : units_) grads.push_back(u->grad_buffer());
  return global_norm(on_device() ? device_grad_sq_sum(grads) : grad_sq_sum(grads));
}

std::string ShardedTrainingState::first_non_finite_gradient() { return first_non_finite_gradient({}); }

void ShardedTrainingState::skip() {
  for (auto& u : units_) zero_gradient(*u);
}

void ShardedTrainingState::update(double lr, std::optional<float> clip) {
  if (clip) scale_gradients(*clip);
  for (int i = 0; i < num_units(); ++i) update_unit(i, lr);
}

void ShardedTrainingState::scale_gradients(float factor) {
  for (auto& u : units_) {
    if (u->on_device())
      device_scale(u->grad_d.data<float>(), u->grad_d.numel(), factor);
    else
      scale_host(u->grad, factor);
  }
}

double ShardedTrainingState::global_norm(double local_sq) { return std::sqrt(groups_.shard->all_reduce_sum(local_sq)); }

bool ShardedTrainingState::overflow_anywhere(bool local) {
  return groups_.world->all_reduce_max(local ? 1.0 : 0.0) > 0.0;
}

std::string ShardedTrainingState::first_non_finite_gradient(const std::vector<std::optional<double>>& updated_sq) {
  // Where, as unit × (entries + 1) + entry, with entry = entries for "somewhere in the unit".
  constexpr double kNone = 1e300;
  double where = kNone;
  for (size_t ui = 0; ui < units_.size() && where == kNone; ++ui) {
    Unit& u = *units_[ui];
    const double base = static_cast<double>(ui) * static_cast<double>(u.trainables.size() + 1);
    if (ui < updated_sq.size() && updated_sq[ui]) {  // the fused update consumed (and zeroed) the gradient
      if (!std::isfinite(*updated_sq[ui])) where = base + static_cast<double>(u.trainables.size());
      continue;
    }
    std::vector<float> on_host;
    const float* grad = u.step_gradient();
    if (u.on_device()) {
      on_host.resize(static_cast<size_t>(u.grad_d.numel()));
      copy_bytes(on_host.data(), Device::CPU, u.grad_d.view().data, Device::CUDA, on_host.size() * sizeof(float));
      grad = on_host.data();
    }
    const int64_t begin = u.shard_begin, end = begin + u.shard_numel;
    for (size_t ei = 0; ei < u.trainables.size() && where == kNone; ++ei) {
      const TrainableSlot& e = u.trainables[ei];
      for (int64_t i = std::max(begin, e.offset); i < std::min(end, e.offset + e.numel); ++i)
        if (!std::isfinite(grad[i - begin])) {
          where = base + static_cast<double>(ei);
          break;
        }
    }
  }
  where = -groups_.shard->all_reduce_max(-where);  // the first over the shards
  for (size_t ui = 0; ui < units_.size(); ++ui) {
    const Unit& u = *units_[ui];
    const double base = static_cast<double>(ui) * static_cast<double>(u.trainables.size() + 1);
    if (where < base || where >= base + static_cast<double>(u.trainables.size() + 1)) continue;
    const size_t entry = static_cast<size_t>(where - base);
    if (entry < u.trainables.size()) return fmt::format("tensor '{}'", u.trainables[entry].name);
    return fmt::format("one of unit {}'s {} tensors (the first '{}'; it was updated during backward)", ui,
                       u.trainables.size(), u.trainables.empty() ? "?" : u.trainables.front().name);
  }
  return "no gradient shard (the non-finite value is in the norm's reduction)";
}

// ---- Unit by unit ------------------------------------------------------------------------------

double ShardedTrainingState::grad_sq(int index) {
  const GradBuffer g = unit(index).grad_buffer();
  return grad_sq_sum(g.data, g.numel);
}

bool ShardedTrainingState::unscale_unit(int index, const DynamicLossScaler& scaler) {
  Unit& u = unit(index);
  return scaler.unscale(u.grad.data(), static_cast<int64_t>(u.grad.size()));
}

void ShardedTrainingState::accumulate(int index, const float* staged, float scale) {
  Unit& u = unit(index);
  float* grad = u.grad.data();
#pragma omp parallel for if (worth_parallel(u.trainable_numel)) schedule(static)
  for (int64_t i = 0; i < u.trainable_numel; ++i) grad[i] += staged[i] * scale;
  u.grad_zero = false;
}

double ShardedTrainingState::accumulate_and_measure(int index, const float* staged, float scale,
                                                    const DynamicLossScaler* scaler, bool* found_nonfinite) {
  Unit& u = unit(index);
  // The elements past the trainables are padding, always zero, and add nothing to the sum.
  const double sq = scaler ? accumulate_and_sq_sum(u.grad.data(), staged, scale, u.trainable_numel,
                                                   scaler->inv_scale(), found_nonfinite)
                           : accumulate_and_sq_sum(u.grad.data(), staged, scale, u.trainable_numel);
  u.grad_zero = false;
  return sq;
}

double ShardedTrainingState::take_gradient(int index, float* staged) {
  Unit& u = unit(index);
  // The same values, the same order as accumulate_and_sq_sum's; the padding past the trainables
  // is zero in `grad` and adds nothing.
  const double sq = grad_sq_sum(staged, u.trainable_numel);
  u.staged_gradient = staged;
  return sq;
}

bool ShardedTrainingState::gradient_is_zero(int index) const { return unit(index).grad_zero; }

void ShardedTrainingState::update_with_compute_copies(int index, double lr, float grad_scale, void* compute,
                                                      DType compute_dtype) {
  Unit& u = unit(index);
  StepFusion fusion;
  fusion.grad_scale = grad_scale;
  fusion.zero_grad = u.staged_gradient == nullptr;  // a staged gradient left `grad` at zero
  fusion.compute = compute;
  fusion.compute_dtype = compute_dtype;
  fusion.compute_numel = u.trainable_numel;
  u.optimizer->step(u.master.data(), u.step_gradient(), lr, fusion);
  u.staged_gradient = nullptr;
  u.grad_zero = true;
}

void ShardedTrainingState::write_compute_copies_on_update(int index, void* compute_device, DType dtype) {
  Unit& u = unit(index);
  if (compute_device != nullptr && !u.on_device())
    throw std::logic_error("ShardedTrainingState: compute copies written on update need the state on the GPU");
  u.update_compute = compute_device;
  u.update_compute_dtype = dtype;
  u.compute_written = false;
}

bool ShardedTrainingState::compute_written(int index) {
  Unit& u = unit(index);
  return std::exchange(u.compute_written, false);
}

void ShardedTrainingState::update_unit(int index, double lr) {
  Unit& u = unit(index);
  if (u.on_device() && u.update_compute != nullptr) {
    u.device_optimizer->step(u.master_d.data<float>(), u.grad_d.data<float>(), lr, u.update_compute,
                             u.update_compute_dtype);
    u.compute_written = true;
  } else if (u.on_device())
    u.device_optimizer->step(u.master_d.data<float>(), u.grad_d.data<float>(), lr);
  else
    u.optimizer->step(u.master.data(), u.step_gradient(), lr);
  zero_gradient(u);
}

void ShardedTrainingState::zero_gradient(Unit& u) {
  if (u.on_device())
    device_fill_zero(u.grad_d.data<float>(), u.grad_d.numel());
  else
    std::fill(u.grad.begin(), u.grad.end(), 0.0f);
  u.grad_zero = true;
  u.staged_gradient = nullptr;
}

// ---- Checkpoints -------------------------------------------------------------------------------

int64_t ShardedTrainingState::optimizer_steps() const {
  if (units_.empty()) return 0;
  const Unit& u = *units_.front();
  return u.on_device() ? u.device_optimizer->step_count() : u.optimizer->step_count();
}

void ShardedTrainingState::set_optimizer_steps(int64_t optimizer_steps) {
  for (auto& u : units_) {
    const nlohmann::json state = optimizer_state_json(optimizer_.kind, optimizer_steps, u->shard_numel);
    if (u->on_device())
      u->device_optimizer->load_state_json(state);
    else
      u->optimizer->load_state_json(state);
  }
}

void ShardedTrainingState::for_each_trainable(const std::function<void(TrainableShard&)>& visit) {
  for (auto& up : units_) {
    Unit& u = *up;
    const int64_t begin = u.shard_begin, end = begin + u.shard_numel;
    // Visitors read (save) or write (load) host spans: state on the GPU is staged through host
    // copies, written back afterwards (checkpoints are rare; the copies are the shard's size).
    std::vector<std::vector<float>> staged;
    std::vector<std::span<float>> state;
    if (u.on_device()) {
      u.master_to_host();
      for (const auto& buffer : u.device_optimizer->state_buffers()) {
        staged.emplace_back(static_cast<size_t>(buffer.numel));
        u.device_optimizer->copy_state_to_host(staged.size() - 1, 0, staged.back());
        state.push_back(staged.back());
      }
    } else {
      for (auto& buffer : u.optimizer->state_buffers()) state.push_back(buffer.data);
    }
    for (const TrainableSlot& e : u.trainables) {
      const int64_t lo = std::max(begin, e.offset), hi = std::max(lo, std::min(end, e.offset + e.numel));
      const size_t at = static_cast<size_t>(std::min(lo, end) - begin), n = static_cast<size_t>(hi - lo);
      TrainableShard shard{e.name, e.shape, lo - e.offset, std::span<float>(u.master.data() + at, n), {}};
      for (auto& buffer : state) shard.state.push_back(buffer.subspan(at, n));
      visit(shard);
    }
    if (u.on_device()) {
      u.master_to_device();
      for (size_t b = 0; b < staged.size(); ++b) u.device_optimizer->copy_state_from_host(b, 0, staged[b]);
    }
    u.compute_written = false;  // a visitor may have changed the masters
  }
}

}  // namespace fsdpq
