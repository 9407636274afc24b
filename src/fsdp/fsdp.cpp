#include "fsdp/fsdp.h"

#include <fmt/format.h>

#include <cstring>
#include <new>
#include <stdexcept>

#include "model/llama_weights.h"
#include "runtime/host_out_of_memory.h"
#include "runtime/watchdog.h"

namespace fsdpq {
namespace {

// A whole unit's fp32 masters, flat in its layout (a shard group of one: the shard is the unit).
std::vector<float> whole_masters(const ParamUnit& contents, const UnitLayout& layout) {
  std::vector<float> master;
  try {
    master.assign(static_cast<size_t>(layout.shard_numel), 0.0f);
  } catch (const std::bad_alloc&) {
    fail_host_allocation(static_cast<size_t>(layout.shard_numel) * sizeof(float),
                         fmt::format("the fp32 master of a shard of {} parameters", layout.shard_numel));
  }
  for (size_t k = 0; k < contents.trainable.size(); ++k) {
    const TrainableTensor& t = *contents.trainable[k];
    if (t.shape.numel() > 0)
      std::memcpy(master.data() + layout.trainable_offset[k], t.master.data<float>(),
                  static_cast<size_t>(t.shape.numel()) * sizeof(float));
  }
  return master;
}

}  // namespace

Fsdp::Fsdp(ProcessGroups& groups, FsdpOptions options, int num_units)
    : groups_(groups),
      options_(std::move(options)),
      state_(groups, options_.optimizer, options_.state_device, num_units),
      parameters_(groups,
                  {.compute_dtype = options_.compute_dtype,
                   .device = options_.device,
                   .offload_frozen = options_.offload_frozen},
                  state_, num_units) {}

Fsdp::~Fsdp() = default;

void Fsdp::adopt_whole_unit(int unit, ParamUnit& contents) {
  if (!parameters_.resident())
    throw std::logic_error("Fsdp: a shard group of more than one rank adopts the shards it built (adopt_unit)");
  const UnitLayout layout = unit_layout(contents, 1);
  adopt_unit(unit, contents, layout, {}, whole_masters(contents, layout));
}

void Fsdp::adopt_unit(int unit, ParamUnit& contents, const UnitLayout& layout, std::vector<uint8_t> frozen_shard,
                      std::vector<float> master_shard) {
  watchdog_progress();
  parameters_.adopt(unit, contents, layout, std::move(frozen_shard), master_shard);
  state_.adopt(unit, contents, layout, std::move(master_shard));
}

void Fsdp::attach(LlamaModel& model) {
  parameters_.attach(model);
  // One rank only: with more (ddp, or hybrid over nodes of one rank) the gradients are all-reduced
  // on the main thread before any update, as the parameters' reduction does.
  if (groups_.world->size() == 1 && options_.overlap_host_optimizer && options_.state_device == Device::CPU) {
    offload_ = std::make_unique<HostOffloadScheduler>(parameters_, state_, options_.device);
    offload_->set_event_sink(event_sink_);
    model.set_unit_hooks(offload_.get());
  } else {
    model.set_unit_hooks(&parameters_);
  }
}

void Fsdp::before_last_micro_batch(const StepRequest& request) {
  if (offload_) offload_->before_last_micro_batch(request);
}

StepOutcome Fsdp::step(const StepRequest& request) {
  parameters_.expect_gradients_reduced();
  if (offload_) return offload_->step(request);
  const StepOutcome outcome = run_step(request, state_);
  if (outcome.updated()) parameters_.write_compute_copies();  // they follow the masters
  return outcome;
}

void Fsdp::settle() {
  if (offload_) offload_->settle();
}

ShardedTrainingState& Fsdp::state() {
  settle();
  return state_;
}

void Fsdp::masters_loaded(int64_t optimizer_steps) {
  settle();
  state_.set_optimizer_steps(optimizer_steps);
  parameters_.write_compute_copies();
}

void Fsdp::gather_masters_into_model() {
  settle();
  parameters_.gather_masters_into_model();
}

CommTimes Fsdp::take_times() {
  CommTimes t = parameters_.take_times();
  if (offload_) t += offload_->take_times();
  return t;
}

void Fsdp::set_event_sink(EventSink sink) {
  event_sink_ = std::move(sink);
  parameters_.set_event_sink(event_sink_);
  if (offload_) offload_->set_event_sink(event_sink_);
}

}  // namespace fsdpq
