#include "fsdp/host_offload_scheduler.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <utility>

namespace fsdpq {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

struct HostOffloadScheduler::UnitWork {
  // The gradients copied out (fp32) and the compute copies going back in (page-locked), sized once
  // at construction: the worker thread never allocates.
  HostStaging grads_out, compute_in;
  uint64_t accumulate_ticket = 0;  // the last worker job reading grads_out
  uint64_t update_ticket = 0;      // the worker job updating this unit, until waited for
  StreamMark uploaded;             // the new compute copies are in the model's tensors
  // What the worker did with this step's gradient during the backward; grad_sq is the sum of
  // squares of the gradient the step uses, found_inf whether it overflowed (fp16).
  enum class Done { Nothing, Measured, Updated } done = Done::Nothing;
  double grad_sq = 0;
  bool found_inf = false;
};

HostOffloadScheduler::HostOffloadScheduler(ShardedParameters& parameters, ShardedTrainingState& state, Device device)
    : parameters_(parameters), state_(state) {
  if (state_.on_device()) throw std::logic_error("HostOffloadScheduler: the training state must live on the host");
  grad_copies_ = std::make_unique<SideStream>(device);
  upload_copies_ = std::make_unique<SideStream>(device);
  worker_ = std::make_unique<WorkerThread>(follow_current_gpu());
  const size_t element = dtype_size(parameters_.compute_dtype());
  for (int i = 0; i < state_.num_units(); ++i) {
    units_.push_back(std::make_unique<UnitWork>());
    units_.back()->grads_out.reserve(static_cast<size_t>(state_.shard_numel(i)) * sizeof(float));
    units_.back()->compute_in.reserve(static_cast<size_t>(state_.trainable_numel(i)) * element);
  }
}

HostOffloadScheduler::~HostOffloadScheduler() = default;

// ---- UnitHooks ---------------------------------------------------------------------------------

void HostOffloadScheduler::forward_begin(int unit) {
  wait_for_update(unit);
  parameters_.forward_begin(unit);
}

void HostOffloadScheduler::forward_end(int unit, bool backward_follows) {
  parameters_.forward_end(unit, backward_follows);
}

void HostOffloadScheduler::backward_begin(int unit) {
  wait_for_update(unit);
  parameters_.backward_begin(unit);
}

void HostOffloadScheduler::backward_end(int unit) {
  if (parameters_.syncs_gradients() && parameters_.holds_gradients(unit)) take_gradients(unit);
  parameters_.backward_end(unit);  // nothing left to reduce
}

void HostOffloadScheduler::take_gradients(int unit) {
  UnitWork& w = *units_[static_cast<size_t>(unit)];
  const auto start = Clock::now();
  // Copy out behind the unit's backward, on a side stream; the compute stream may reuse the
  // gradients' memory (freed below) only once the copy has read it.
  // The previous micro-batch's job may still be reading this unit's staging buffer, and so may the
  // last step's update (when it took its gradient from there; the forward waited for it already).
  if (w.accumulate_ticket) worker_->wait_for(w.accumulate_ticket);
  wait_for_update(unit);
  // The whole shard: an update that reads its gradient here reads the padding past the trainables
  // too, zero as in the state's gradient.
  const int64_t shard_numel = state_.shard_numel(unit);
  auto* staged = static_cast<float*>(w.grads_out.reserve(static_cast<size_t>(shard_numel) * sizeof(float)));
  std::fill(staged + state_.trainable_numel(unit), staged + shard_numel, 0.0f);
  grad_copies_->wait_for_compute();
  for (const TrainableEntry& e : parameters_.trainables(unit))
    grad_copies_->copy(staged + e.offset, Device::CPU, e.tensor->grad.view().data, e.tensor->grad.device(),
                       static_cast<size_t>(e.numel) * sizeof(float));
  const StreamMark copied = grad_copies_->mark();
  copied.compute_waits();
  parameters_.free_gradients(unit);
  const BackwardWork work = work_;
  const StepRequest request = planned_;
  w.accumulate_ticket = worker_->post([this, unit, staged, copied, work, request] {
    const auto copy_wait = Clock::now();
    copied.host_wait();
    if (event_sink_) event_sink_("host copy-out wait", parameters_.unit_name(unit), copy_wait, Clock::now());
    accumulate_on_worker(unit, staged, work, request);
  });
  const auto end = Clock::now();
  times_.reduce += std::chrono::duration<double>(end - start).count();
  if (event_sink_) event_sink_("reduce", parameters_.unit_name(unit), start, end);
}

void HostOffloadScheduler::accumulate_on_worker(int unit, float* staged, BackwardWork work, const StepRequest& request) {
  UnitWork& w = *units_[static_cast<size_t>(unit)];
  struct Span {  // "host accumulate" from here to the end (the update, if any, is its own span)
    const HostOffloadScheduler& scheduler;
    int unit;
    Clock::time_point begin = Clock::now();
    bool done = false;
    void end() {
      if (!done && scheduler.event_sink_)
        scheduler.event_sink_("host accumulate", scheduler.parameters_.unit_name(unit), begin, Clock::now());
      done = true;
    }
    ~Span() { end(); }
  } span{*this, unit};
  // One rank: every micro-batch's gradient counts whole.
  constexpr float kInvWorld = 1.0f;
  if (work == BackwardWork::Accumulate) {
    state_.accumulate(unit, staged, kInvWorld);
    return;
  }
  // The step's last gradient: added up, unscaled (fp16) and measured in one pass — what unscale
  // and grad_norm compute on the main thread otherwise, the same way.
  const DynamicLossScaler* scaler = request.scaler;  // none when updating: before_last_micro_batch chose so
  bool found_inf = false;
  if (state_.gradient_is_zero(unit) && !scaler)
    w.grad_sq = state_.take_gradient(unit, staged);  // 0 + staged is staged: it stays where it is
  else
    w.grad_sq = state_.accumulate_and_measure(unit, staged, kInvWorld, scaler, &found_inf);
  w.found_inf = found_inf;
  span.end();
  if (work == BackwardWork::Measure) {
    w.done = UnitWork::Done::Measured;
    return;
  }
  update_on_worker(unit, request.lr, 1.0f);
  w.done = UnitWork::Done::Updated;
}

void HostOffloadScheduler::update_on_worker(int unit, double lr, float grad_scale) {
  UnitWork& w = *units_[static_cast<size_t>(unit)];
  const auto start = Clock::now();
  const DType dtype = parameters_.compute_dtype();
  const size_t element = dtype_size(dtype);
  auto* compute = static_cast<uint8_t*>(w.compute_in.reserve(static_cast<size_t>(state_.trainable_numel(unit)) * element));
  state_.update_with_compute_copies(unit, lr, grad_scale, compute, dtype);
  for (const TrainableEntry& e : parameters_.trainables(unit)) {
    Tensor& t = parameters_.compute_tensor(e);
    upload_copies_->copy(t.view().data, t.device(), compute + static_cast<size_t>(e.offset) * element, Device::CPU,
                         static_cast<size_t>(e.numel) * element);
  }
  w.uploaded = upload_copies_->mark();
  if (event_sink_) event_sink_("host update", parameters_.unit_name(unit), start, Clock::now());
}

void HostOffloadScheduler::wait_for_update(int unit) {
  UnitWork& w = *units_[static_cast<size_t>(unit)];
  if (w.update_ticket == 0) return;
  const uint64_t ticket = std::exchange(w.update_ticket, 0);
  const auto start = Clock::now();
  worker_->wait_for(ticket);
  if (event_sink_) event_sink_("update wait", parameters_.unit_name(unit), start, Clock::now());
  w.uploaded.compute_waits();
  w.uploaded = {};
}

void HostOffloadScheduler::settle() {
  worker_->drain();
  for (int i = 0; i < static_cast<int>(units_.size()); ++i) wait_for_update(i);
}

// ---- The step ----------------------------------------------------------------------------------

void HostOffloadScheduler::before_last_micro_batch(const StepRequest& request) {
  planned_ = request;
  work_ = !request.scaler && !request.clip_to_norm ? BackwardWork::Update : BackwardWork::Measure;
}

StepOutcome HostOffloadScheduler::step(const StepRequest& request) {
  if (work_ != BackwardWork::Accumulate &&
      (request.scaler != planned_.scaler || request.clip_to_norm.has_value() != planned_.clip_to_norm.has_value() ||
       (work_ == BackwardWork::Update && request.lr != planned_.lr)))
    throw std::logic_error("HostOffloadScheduler: the step asks for other work than its backward was planned for");
  const StepOutcome outcome = run_step(request, *this);
  work_ = BackwardWork::Accumulate;  // until the next step's last micro-batch
  return outcome;
}

bool HostOffloadScheduler::unscale(const DynamicLossScaler& scaler) {
  settle();
  bool found = false;
  for (int i = 0; i < static_cast<int>(units_.size()); ++i) {
    const UnitWork& w = *units_[static_cast<size_t>(i)];
    found |= w.done == UnitWork::Done::Measured ? w.found_inf : state_.unscale_unit(i, scaler);
  }
  return state_.overflow_anywhere(found);
}

double HostOffloadScheduler::grad_norm() {
  const auto start = Clock::now();
  settle();
  if (event_sink_) event_sink_("norm wait", "all units", start, Clock::now());
  // The units the worker measured (before updating them, if it did) add what it found; the
  // others (no backward this step) what they hold. Unit by unit, in order, as the state does.
  double sq = 0;
  for (int i = 0; i < static_cast<int>(units_.size()); ++i) {
    const UnitWork& w = *units_[static_cast<size_t>(i)];
    sq += w.done != UnitWork::Done::Nothing ? w.grad_sq : state_.grad_sq(i);
  }
  return state_.global_norm(sq);
}

std::string HostOffloadScheduler::first_non_finite_gradient() {
  settle();
  std::vector<std::optional<double>> updated_sq(units_.size());
  for (size_t i = 0; i < units_.size(); ++i)
    if (units_[i]->done == UnitWork::Done::Updated) updated_sq[i] = units_[i]->grad_sq;
  return state_.first_non_finite_gradient(updated_sq);
}

void HostOffloadScheduler::skip() {
  settle();
  state_.skip();
  for (auto& w : units_) {
    w->done = UnitWork::Done::Nothing;
    w->found_inf = false;
  }
}

void HostOffloadScheduler::update(double lr, std::optional<float> clip) {
  settle();
  // After measuring in the backward the updates are queued on the worker, in forward order (the
  // units' order): the next pass waits for each only when it gets there.
  const bool queue = work_ == BackwardWork::Measure;
  if (queue)  // they overwrite compute copies the GPU may still be reading in queued work
    upload_copies_->wait(mark_compute());
  else if (clip)  // after a backward that only added up (step() rules out clipping after updates)
    state_.scale_gradients(*clip);
  for (int i = 0; i < static_cast<int>(units_.size()); ++i) {
    UnitWork& w = *units_[static_cast<size_t>(i)];
    if (w.done == UnitWork::Done::Updated) continue;  // on the worker, during backward
    w.done = UnitWork::Done::Nothing;
    w.found_inf = false;
    if (queue && state_.trainable_numel(i) > 0) {
      const float grad_scale = clip.value_or(1.0f);
      w.update_ticket = worker_->post([this, i, lr, grad_scale] { update_on_worker(i, lr, grad_scale); });
      continue;
    }
    state_.update_unit(i, lr);
  }
  finish_updates();
}

void HostOffloadScheduler::finish_updates() {
  // The worker sends (or sent) the compute copies of the units it updates (or updated).
  parameters_.write_compute_copies([this](int i) {
    const UnitWork& w = *units_[static_cast<size_t>(i)];
    return w.update_ticket == 0 && w.done != UnitWork::Done::Updated;
  });
  for (auto& w : units_) {
    if (w->update_ticket) continue;  // still queued: forward_begin waits for it
    // The next pass computes with the compute copies the worker sent.
    w->uploaded.compute_waits();
    w->uploaded = {};
    w->done = UnitWork::Done::Nothing;
  }
}

CommTimes HostOffloadScheduler::take_times() {
  CommTimes t = std::exchange(times_, {});
  t.host_worker = worker_->take_busy_seconds();
  return t;
}

}  // namespace fsdpq
