#include "fsdp/sharded_parameters.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string_view>
#include <utility>

#include "fsdp/frozen_offload.h"
#include "model/llama_weights.h"
#include "ops/elementwise.h"
#include "ops/parallel.h"
#include "optim/device_grads.h"
#include "optim/device_optimizer.h"
#include "runtime/watchdog.h"
#include "util/bf16.h"

namespace fsdpq {
namespace {

// FSDPQ_FUSED_COMPUTE_COPIES (runtime/environment.cpp checks the value): 0 turns off writing a
// resident GPU unit's compute copies in the optimizer's pass (ShardedParameters::write_unit_compute_copies).
bool fused_compute_copies() {
  static const bool on = [] {
    const char* env = std::getenv("FSDPQ_FUSED_COMPUTE_COPIES");
    return env == nullptr || std::string_view(env) != "0";
  }();
  return on;
}

// FSDPQ_GRADIENTS_IN_STATE (runtime/environment.cpp checks the value): 0 turns off accumulating
// the gradients in the state's shard in place (ShardedParameters::backward_begin).
bool gradients_in_state() {
  static const bool on = [] {
    const char* env = std::getenv("FSDPQ_GRADIENTS_IN_STATE");
    return env == nullptr || std::string_view(env) != "0";
  }();
  return on;
}

using Clock = std::chrono::steady_clock;

size_t round_up(size_t n, size_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// Copies logical bytes [begin, begin + n) of a region that is split over ranks in pieces of
// `piece` bytes, piece r stored at base + r * stride (the layout of an all-gather's output); both
// sides on `device`.
void copy_from_pieces(const uint8_t* base, size_t stride, size_t piece, size_t begin, uint8_t* dst, size_t n,
                      Device device) {
  while (n > 0) {
    const size_t r = begin / piece, within = begin % piece, take = std::min(n, piece - within);
    copy_bytes(dst, device, base + r * stride + within, device, take);
    dst += take;
    begin += take;
    n -= take;
  }
}

// Stores fp32 values in the compute dtype (bf16 / f16: round to nearest even, as refresh_compute).
void store_compute(DType dtype, const float* src, int64_t n, uint8_t* dst) {
  if (n == 0) return;  // an empty shard's pointers may be null, which memcpy may not be given
  if (dtype == DType::F32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
  } else if (dtype == DType::BF16) {
    auto* out = reinterpret_cast<uint16_t*>(dst);
#pragma omp parallel for if (worth_parallel(n)) schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = float_to_bf16(src[i]);
  } else if (dtype == DType::F16) {
    auto* out = reinterpret_cast<uint16_t*>(dst);
#pragma omp parallel for if (worth_parallel(n)) schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = float_to_f16(src[i]);
  } else {
    throw std::logic_error("ShardedParameters: compute dtype must be F32, BF16 or F16");
  }
}

// Writes a tensor's bytes with `write(host_bytes)`: in place on the CPU, through a host staging
// buffer for a device tensor (the shards and messages are host memory).
template <class Write>
void write_tensor_bytes(Tensor& t, HostStaging& staging, Write&& write) {
  if (t.device() == Device::CPU) {
    write(static_cast<uint8_t*>(t.view().data));
    return;
  }
  auto* staged = static_cast<uint8_t*>(staging.reserve(t.nbytes()));
  write(staged);
  copy_bytes(t.view().data, t.device(), staged, Device::CPU, t.nbytes());
}

// The tensor a gathered trainable computes with: the master itself in fp32, else the compute copy.
Tensor& compute_tensor_of(TrainableTensor& t, DType dtype) { return dtype == DType::F32 ? t.master : t.compute; }

double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

}  // namespace

struct ShardedParameters::Unit {
  int index = 0;
  std::string name;
  bool adopted = false;

  // Layout (the same on every rank).
  std::vector<BaseWeight*> frozen;
  std::vector<FrozenSegment> segments;
  size_t frozen_bytes = 0, frozen_shard_bytes = 0;
  std::vector<TrainableEntry> trainables;
  int64_t trainable_numel = 0, shard_numel = 0;
  size_t compute_shard_bytes = 0;  // shard_numel compute elements, padded to the gather granule
  size_t chunk_bytes = 0;          // one rank's part of the gather: [frozen shard | compute shard]

  // What this rank sends to a gather (sharded only): [frozen shard | compute shard], chunk_bytes
  // at `send`, on the GPU when the masters are there (send_on_device), else in host memory
  // (send_on_host, page-locked once CUDA runs: the CPU backend, use_cpu_offload).
  Tensor send_on_device;
  HostStaging send_on_host;
  uint8_t* send = nullptr;
  Device send_device = Device::CPU;

  // Gathering, on the model's device: the gather's output until unpacked, and a host-homed
  // shard's copy on the GPU for the gather in flight.
  Tensor recv, send_copy;
  CollectiveHandle pending;
  bool gathered = false;       // the model's tensors hold the full parameters
  bool grads_present = false;  // the model's gradient tensors are allocated (and accumulate)
  bool grads_in_state = false;  // they are blocks of the training state's gradient shard (borrowed)
  // One GPU's resident unit: its trainables' compute copies as blocks (borrowed) of one buffer of
  // shard_numel elements, which the optimizer's update writes (compute_copies_in_one_buffer).
  Tensor compute_flat;

  // offload_frozen: the frozen weights' host copy and their presence on the device.
  std::unique_ptr<OffloadedFrozen> offloaded;
};

ShardedParameters::ShardedParameters(ProcessGroups& groups, ParameterOptions options, ShardedTrainingState& state,
                                     int num_units)
    : groups_(groups),
      options_(std::move(options)),
      state_(state),
      reshard_after_forward_(reshards_after_forward(groups.strategy)),
      last_layer_unit_(num_units - 1) {
  if (options_.compute_dtype != DType::F32 && options_.compute_dtype != DType::BF16 &&
      options_.compute_dtype != DType::F16)
    throw std::logic_error("ShardedParameters: compute dtype must be F32, BF16 or F16");
  for (int i = 0; i < num_units; ++i) {
    units_.push_back(std::make_unique<Unit>());
    units_.back()->index = i;
  }
}

ShardedParameters::~ShardedParameters() = default;

bool ShardedParameters::resident() const { return groups_.shard->size() == 1; }

ShardedParameters::Unit& ShardedParameters::unit(int index) {
  if (index < 0 || index >= static_cast<int>(units_.size()))
    throw std::logic_error(fmt::format("ShardedParameters: no unit {}", index));
  return *units_[static_cast<size_t>(index)];
}

const ShardedParameters::Unit& ShardedParameters::unit(int index) const {
  return const_cast<ShardedParameters*>(this)->unit(index);
}

// ---- Adoption ----------------------------------------------------------------------------------

void ShardedParameters::record_layout(Unit& u, ParamUnit& contents, const UnitLayout& layout) {
  if (u.adopted) throw std::logic_error(fmt::format("ShardedParameters: unit {} adopted twice", u.index));
  if (contents.trainable.size() != layout.trainable_offset.size())
    throw std::logic_error(fmt::format("ShardedParameters: unit {}'s layout does not match its tensors", u.index));
  u.adopted = true;
  u.name = contents.name;
  u.frozen = contents.frozen;
  u.segments = layout.segments;
  u.frozen_bytes = layout.frozen_bytes;
  u.frozen_shard_bytes = layout.frozen_shard_bytes;
  for (size_t k = 0; k < contents.trainable.size(); ++k) {
    TrainableTensor* t = contents.trainable[k];
    u.trainables.push_back({t, t->name, t->shape, layout.trainable_offset[k], t->shape.numel()});
  }
  u.trainable_numel = layout.trainable_numel;
  u.shard_numel = layout.shard_numel;
  u.compute_shard_bytes = round_up(static_cast<size_t>(u.shard_numel) * dtype_size(options_.compute_dtype),
                                   Communicator::kAllGatherGranule);
  u.chunk_bytes = u.frozen_shard_bytes + u.compute_shard_bytes;
}

void ShardedParameters::adopt(int index, ParamUnit& contents, const UnitLayout& layout,
                              std::vector<uint8_t> frozen_shard, std::span<const float> master) {
  Unit& u = unit(index);
  record_layout(u, contents, layout);
  if (master.size() != static_cast<size_t>(u.shard_numel))
    throw std::logic_error(fmt::format("ShardedParameters: unit {}'s masters do not match its layout", index));
  if (resident()) {
    if (!frozen_shard.empty()) throw std::logic_error("ShardedParameters: a resident unit keeps its own frozen bytes");
    adopt_resident(u, contents);
    return;
  }
  if (frozen_shard.size() != u.frozen_shard_bytes)
    throw std::logic_error(fmt::format("ShardedParameters: unit {}'s frozen shard does not match its layout", index));
  frozen_shard.resize(u.chunk_bytes, 0);
  store_compute(options_.compute_dtype, master.data(), u.shard_numel, frozen_shard.data() + u.frozen_shard_bytes);
  keep_send(u, frozen_shard);
  u.gathered = false;
}

void ShardedParameters::adopt_resident(Unit& u, ParamUnit& contents) {
  // The training state's master is the only fp32 copy the optimizer steps; the model keeps what
  // it computes with.
  for (const TrainableEntry& e : u.trainables) {
    if (options_.compute_dtype != DType::F32) e.tensor->master = Tensor();
    e.tensor->grad = Tensor();
  }
  u.gathered = true;
  // The root (embedding, final norm, head) is used at both ends of every pass: it stays.
  if (options_.offload_frozen && u.index != kRootUnit && !u.frozen.empty())
    u.offloaded = std::make_unique<OffloadedFrozen>(contents, options_.device);
}

void ShardedParameters::keep_send(Unit& u, const std::vector<uint8_t>& chunk) {
  const int64_t n = static_cast<int64_t>(u.chunk_bytes);
  u.send_device = options_.device == Device::CUDA && state_.on_device() ? Device::CUDA : Device::CPU;
  if (u.send_device == Device::CUDA) {
    u.send_on_device = Tensor::empty(Shape{n}, DType::U8, Device::CUDA);
    u.send = static_cast<uint8_t*>(u.send_on_device.view().data);
  } else {
    u.send = static_cast<uint8_t*>(u.send_on_host.reserve(u.chunk_bytes));
  }
  copy_bytes(u.send, u.send_device, chunk.data(), Device::CPU, u.chunk_bytes);
}

void ShardedParameters::attach(LlamaModel& model) {
  std::vector<ParamUnit> units = model.param_units();
  if (units.size() != units_.size())
    throw std::logic_error(fmt::format("ShardedParameters: model has {} units, FSDP {}", units.size(), units_.size()));
  for (size_t i = 0; i < units.size(); ++i) {
    Unit& u = *units_[i];
    if (!u.adopted) throw std::logic_error(fmt::format("ShardedParameters: unit {} was never adopted", i));
    // The root's weights are members of the model, which moved since it was built: rebind by position.
    if (units[i].frozen.size() != u.frozen.size() || units[i].trainable.size() != u.trainables.size())
      throw std::logic_error(fmt::format("ShardedParameters: unit {} changed its tensors", i));
    for (size_t k = 0; k < u.frozen.size(); ++k) u.frozen[k] = units[i].frozen[k];
    for (size_t k = 0; k < u.trainables.size(); ++k) {
      if (units[i].trainable[k]->name != u.trainables[k].name)
        throw std::logic_error(fmt::format("ShardedParameters: unit {} tensor {} is now '{}', was '{}'", i, k,
                                           units[i].trainable[k]->name, u.trainables[k].name));
      u.trainables[k].tensor = units[i].trainable[k];
    }
    if (u.offloaded) u.offloaded->rebind(u.frozen);
  }
  if (resident() && options_.offload_frozen) frozen_copies_ = std::make_unique<SideStream>(options_.device);
}

// ---- Gathers -----------------------------------------------------------------------------------

Communicator& ShardedParameters::gather_comm() {
  if (options_.device == Device::CPU) return *groups_.shard;
  if (!groups_.shard_device)
    throw std::logic_error("ShardedParameters: a sharded model on the GPU needs the shard group's device collectives");
  return *groups_.shard_device;
}

Communicator* ShardedParameters::replicate_comm() {
  if (groups_.replicate->size() == 1) return nullptr;
  if (options_.device == Device::CPU) return groups_.replicate.get();
  if (!groups_.replicate_device)
    throw std::logic_error(
        "ShardedParameters: a replicated model on the GPU needs the replicate group's device collectives");
  return groups_.replicate_device.get();
}

float* ShardedParameters::comm_scratch(HostStaging& host, Tensor& holder, size_t n) {
  if (options_.device == Device::CPU) return static_cast<float*>(host.reserve(n * sizeof(float)));
  holder = Tensor::empty(Shape{static_cast<int64_t>(n)}, DType::F32, options_.device);
  return holder.data<float>();
}

void ShardedParameters::start_gather(Unit& u) {
  if (u.gathered || u.pending.pending()) return;
  const Device device = options_.device;
  u.recv = Tensor::empty(Shape{static_cast<int64_t>(u.chunk_bytes) * groups_.shard->size()}, DType::U8, device);
  const uint8_t* send = u.send;
  if (u.send_device != device) {
    // use_cpu_offload on a GPU: the shard waits in host memory and comes in for its gather.
    u.send_copy = Tensor::empty(Shape{static_cast<int64_t>(u.chunk_bytes)}, DType::U8, device);
    copy_bytes(u.send_copy.view().data, device, u.send, u.send_device, u.chunk_bytes);
    send = static_cast<const uint8_t*>(u.send_copy.view().data);
  }
  u.pending = gather_comm().all_gather(send, u.recv.view().data, u.chunk_bytes);
}

void ShardedParameters::ensure_gathered(Unit& u) {
  if (u.gathered) return;
  start_gather(u);
  const auto waited = Clock::now();
  u.pending.wait();
  const auto waited_until = Clock::now();
  times_.gather_wait += seconds_between(waited, waited_until);
  if (event_sink_) event_sink_("gather wait", u.name, waited, waited_until);
  // Unpack into the model's tensors, on the device the gather ran on: frozen segments, then the
  // trainables in the compute dtype.
  const Device device = options_.device;
  const auto* recv = static_cast<const uint8_t*>(u.recv.view().data);
  for (const FrozenSegment& seg : u.segments) {
    uint8_t* dst = allocate_segment_storage(*u.frozen[seg.weight], seg, device);
    copy_from_pieces(recv, u.chunk_bytes, u.frozen_shard_bytes, seg.offset, dst, seg.bytes, device);
  }
  const size_t element = dtype_size(options_.compute_dtype);
  const size_t piece = static_cast<size_t>(u.shard_numel) * element;
  for (const TrainableEntry& e : u.trainables) {
    Tensor& t = compute_tensor_of(*e.tensor, options_.compute_dtype);
    t = Tensor::empty(e.shape, options_.compute_dtype, device);
    copy_from_pieces(recv + u.frozen_shard_bytes, u.chunk_bytes, piece, static_cast<size_t>(e.offset) * element,
                     static_cast<uint8_t*>(t.view().data), static_cast<size_t>(e.numel) * element, device);
  }
  u.recv = Tensor();
  u.send_copy = Tensor();
  u.gathered = true;
}

void ShardedParameters::release(Unit& u) {
  if (resident()) return;
  if (u.pending.pending()) u.pending.wait();
  u.recv = Tensor();
  u.send_copy = Tensor();
  if (!u.gathered) return;
  for (BaseWeight* w : u.frozen) evict_frozen_storage(*w);
  for (const TrainableEntry& e : u.trainables) compute_tensor_of(*e.tensor, options_.compute_dtype) = Tensor();
  u.gathered = false;
}

void ShardedParameters::prefetch(int index) {
  if (resident() || index < 0 || index >= static_cast<int>(units_.size())) return;
  start_gather(unit(index));
}

void ShardedParameters::fetch_frozen(int index) {
  if (index < 0 || index >= static_cast<int>(units_.size())) return;
  Unit& u = unit(index);
  if (u.offloaded) u.offloaded->fetch(*frozen_copies_);
}

// ---- UnitHooks ---------------------------------------------------------------------------------

void ShardedParameters::forward_begin(int index) {
  watchdog_progress();
  Unit& u = unit(index);
  ensure_gathered(u);
  prefetch(index + 1);
  if (u.offloaded) u.offloaded->ensure(*frozen_copies_);
  fetch_frozen(index + 1);
}

void ShardedParameters::forward_end(int index, bool backward_follows) {
  Unit& u = unit(index);
  // An offloaded unit leaves the device after its forward, except the last layer, whose backward
  // comes next.
  if (u.offloaded && !(backward_follows && index == last_layer_unit_)) u.offloaded->evict();
  // The root stays for the whole step; the last layer's backward comes next, so it stays too.
  if (backward_follows && (!reshard_after_forward_ || index == kRootUnit || index == last_layer_unit_)) return;
  release(u);
}

void ShardedParameters::backward_begin(int index) {
  // The root's backward begins with the loss: the forward of this pass is complete.
  if (index == kRootUnit && forward_done_) forward_done_();
  Unit& u = unit(index);
  ensure_gathered(u);
  if (index > 1 && reshard_after_forward_) prefetch(index - 1);
  if (u.offloaded) u.offloaded->ensure(*frozen_copies_);
  if (index > 1) fetch_frozen(index - 1);
  if (!u.grads_present) {
    // One GPU, a zero gradient shard (the first micro-batch): the model accumulates straight into
    // it, which is what zeros + the reduce's add would leave there, bit for bit; no zeroing, no add.
    u.grads_in_state = gradients_in_state() && state_.on_device() && groups_.world->size() == 1 &&
                       state_.gradient_is_zero(u.index);
    for (const TrainableEntry& e : u.trainables)
      e.tensor->grad = u.grads_in_state
                           ? Tensor::borrow(state_.gradient_on_device(u.index).slice_rows(e.offset, e.numel).reshaped(e.shape))
                           : Tensor::zeros(e.shape, DType::F32, options_.device);
    if (u.grads_in_state) state_.gradient_written(u.index);
    u.grads_present = true;
  }
}

void ShardedParameters::backward_end(int index) {
  watchdog_progress();
  Unit& u = unit(index);
  if (sync_gradients_) reduce_gradients(u);
  release(u);
  if (u.offloaded) u.offloaded->evict();
}

// ---- Gradients ---------------------------------------------------------------------------------

void ShardedParameters::reduce_gradients(Unit& u) {
  if (!u.grads_present) return;
  const auto start = Clock::now();
  // The average over every rank's micro-batch, as FSDP and DDP average gradients.
  const float inv_world = 1.0f / static_cast<float>(groups_.world->size());
  if (u.grads_in_state) {
    // Accumulated in place (backward_begin): the shard holds them already.
  } else if (state_.on_device() && groups_.world->size() == 1) {
    // One GPU: nothing to communicate, so the gradients never leave the device.
    for (const TrainableEntry& e : u.trainables) state_.add_to_gradient(u.index, e.offset, e.tensor->grad, inv_world);
  } else {
    float* mine = reduce_to_shard(u);
    const Device where = state_.on_device() ? Device::CUDA : Device::CPU;
    state_.add_to_gradient(u.index, 0, TensorView{mine, DType::F32, Shape{u.shard_numel}, where}, inv_world);
  }
  free_gradients(u.index);
  const auto end = Clock::now();
  times_.reduce += seconds_between(start, end);
  if (event_sink_) event_sink_("reduce", u.name, start, end);
}

float* ShardedParameters::reduce_to_shard(Unit& u) {
  // Packed, reduce-scattered over the shard group and all-reduced over the replicas where the
  // model computes (the device collectives on a GPU).
  const Device device = options_.device;
  const size_t S = static_cast<size_t>(groups_.shard->size());
  const size_t total = static_cast<size_t>(u.shard_numel) * S;
  Tensor packed_holder, reduced_holder;
  float* packed = comm_scratch(packed_staging_, packed_holder, total);
  const size_t padding = total - static_cast<size_t>(u.trainable_numel);  // what the tensors do not cover
  if (device == Device::CPU)
    std::fill(packed + u.trainable_numel, packed + total, 0.0f);
  else if (padding > 0)
    device_fill_zero(packed + u.trainable_numel, static_cast<int64_t>(padding));
  for (const TrainableEntry& e : u.trainables)
    copy_bytes(packed + e.offset, device, e.tensor->grad.view().data, e.tensor->grad.device(),
               static_cast<size_t>(e.numel) * sizeof(float));
  // One rank: the packed gradients are its shard's sum already.
  float* mine = packed;
  if (S > 1) {
    mine = comm_scratch(reduced_staging_, reduced_holder, static_cast<size_t>(u.shard_numel));
    gather_comm().reduce_scatter(packed, mine, static_cast<size_t>(u.shard_numel), CommType::F32, ReduceOp::Sum).wait();
  }
  if (Communicator* replicas = replicate_comm())
    replicas->all_reduce(mine, static_cast<size_t>(u.shard_numel), CommType::F32, ReduceOp::Sum).wait();
  if (!state_.on_device() && device != Device::CPU) {
    // use_cpu_offload: the reduced shard comes to the host, where the state lives.
    const auto copies = Clock::now();
    auto* host = static_cast<float*>(offload_staging_.reserve(static_cast<size_t>(u.shard_numel) * sizeof(float)));
    copy_bytes(host, Device::CPU, mine, device, static_cast<size_t>(u.shard_numel) * sizeof(float));
    mine = host;
    times_.offload_copies += seconds_between(copies, Clock::now());
  }
  return mine;
}

void ShardedParameters::free_gradients(int index) {
  Unit& u = unit(index);
  for (const TrainableEntry& e : u.trainables) e.tensor->grad = Tensor();
  u.grads_present = false;
  u.grads_in_state = false;
}

bool ShardedParameters::holds_gradients(int index) const { return unit(index).grads_present; }

void ShardedParameters::expect_gradients_reduced() const {
  for (const auto& u : units_)
    if (u->grads_present)
      throw std::logic_error(fmt::format("ShardedParameters: a step with unit {}'s gradients not yet reduced", u->index));
}

// ---- Compute copies and masters ----------------------------------------------------------------

void ShardedParameters::write_compute_copies(const std::function<bool(int unit)>& wanted) {
  const auto start = Clock::now();
  for (auto& u : units_)
    if (!wanted || wanted(u->index)) write_unit_compute_copies(u->index);
  if (options_.device != Device::CPU && !state_.on_device())
    times_.offload_copies += seconds_between(start, Clock::now());
}

void ShardedParameters::write_unit_compute_copies(int index) {
  Unit& u = unit(index);
  if (!resident()) {
    // No gather may read the shard while it changes, and a gathered unit is gathered again.
    release(u);
    if (u.send_device == Device::CUDA) {
      device_store_compute(options_.compute_dtype, static_cast<const float*>(state_.master_on_device(index).data),
                           u.shard_numel, u.send + u.frozen_shard_bytes);
    } else {
      store_compute(options_.compute_dtype, state_.master_on_host(index).data(), u.shard_numel,
                    u.send + u.frozen_shard_bytes);
    }
    return;
  }
  // The model computes with these tensors directly: write the new values into them, where the
  // update has not already (one buffer for the unit, written by the optimizer's pass).
  if (compute_copies_in_one_buffer(u)) {
    if (!state_.compute_written(index))
      device_store_compute(options_.compute_dtype, static_cast<const float*>(state_.master_on_device(index).data),
                           u.shard_numel, u.compute_flat.view().data);
    return;
  }
  for (const TrainableEntry& e : u.trainables) {
    Tensor& t = compute_tensor_of(*e.tensor, options_.compute_dtype);
    if (state_.on_device() && t.device() == Device::CUDA) {
      copy_convert(t.view().reshaped(Shape{e.numel}), state_.master_on_device(index).slice_rows(e.offset, e.numel));
      continue;
    }
    const float* master = state_.master_on_host(index).data();
    write_tensor_bytes(t, write_staging_, [&](uint8_t* dst) {
      store_compute(options_.compute_dtype, master + e.offset, e.numel, dst);
    });
  }
}

bool ShardedParameters::compute_copies_in_one_buffer(Unit& u) {
  auto borrowed = [&] {
    if (!u.compute_flat.defined()) return false;
    const auto* base = static_cast<const uint8_t*>(u.compute_flat.view().data);
    const size_t element = dtype_size(options_.compute_dtype);
    for (const TrainableEntry& e : u.trainables)
      if (compute_tensor_of(*e.tensor, options_.compute_dtype).view().data != base + static_cast<size_t>(e.offset) * element)
        return false;
    return true;
  };
  if (borrowed()) return true;
  if (u.compute_flat.defined()) {  // the model moved its tensors (place_on): back to one write each
    state_.write_compute_copies_on_update(u.index, nullptr, options_.compute_dtype);
    u.compute_flat = Tensor();
  }
  const bool eligible = fused_compute_copies() && state_.on_device() && !u.trainables.empty() &&
                        std::all_of(u.trainables.begin(), u.trainables.end(), [&](const TrainableEntry& e) {
                          const Tensor& t = compute_tensor_of(*e.tensor, options_.compute_dtype);
                          return t.defined() && t.device() == Device::CUDA && t.dtype() == options_.compute_dtype;
                        });
  if (!eligible) return false;
  // The values come from the masters right after (the caller's store); the tensors' old memory goes.
  u.compute_flat = Tensor::empty(Shape{u.shard_numel}, options_.compute_dtype, Device::CUDA);
  for (const TrainableEntry& e : u.trainables)
    compute_tensor_of(*e.tensor, options_.compute_dtype) =
        Tensor::borrow(u.compute_flat.view().slice_rows(e.offset, e.numel).reshaped(e.shape));
  state_.write_compute_copies_on_update(u.index, u.compute_flat.view().data, options_.compute_dtype);
  return true;
}

void ShardedParameters::gather_masters_into_model() {
  const size_t S = static_cast<size_t>(groups_.shard->size());
  for (auto& up : units_) {
    Unit& u = *up;
    if (u.trainables.empty()) continue;
    const size_t piece = static_cast<size_t>(u.shard_numel) * sizeof(float);
    const size_t chunk = round_up(piece, Communicator::kAllGatherGranule);
    std::vector<uint8_t> send(chunk, 0), recv(chunk * S);
    if (piece > 0) std::memcpy(send.data(), state_.master_on_host(u.index).data(), piece);  // (an empty shard: null)
    groups_.shard->all_gather(send.data(), recv.data(), chunk).wait();
    for (const TrainableEntry& e : u.trainables) {
      if (!e.tensor->master.defined()) e.tensor->master = Tensor::empty(e.shape, DType::F32);
      write_tensor_bytes(e.tensor->master, write_staging_, [&](uint8_t* dst) {
        copy_from_pieces(recv.data(), chunk, piece, static_cast<size_t>(e.offset) * sizeof(float), dst,
                         static_cast<size_t>(e.numel) * sizeof(float), Device::CPU);
      });
    }
  }
}

// ---- For the scheduler, the metrics and tests --------------------------------------------------

std::span<const TrainableEntry> ShardedParameters::trainables(int index) const { return unit(index).trainables; }

Tensor& ShardedParameters::compute_tensor(const TrainableEntry& entry) const {
  return compute_tensor_of(*entry.tensor, options_.compute_dtype);
}

const std::string& ShardedParameters::unit_name(int index) const { return unit(index).name; }

std::vector<uint8_t> ShardedParameters::frozen_shard(int index) const {
  const Unit& u = unit(index);
  if (resident()) return {};
  std::vector<uint8_t> bytes(u.frozen_shard_bytes);
  copy_bytes(bytes.data(), Device::CPU, u.send, u.send_device, bytes.size());
  return bytes;
}

ShardBytes ShardedParameters::shard_bytes() const {
  ShardBytes b;
  for (const auto& u : units_) {
    b.model_frozen += static_cast<int64_t>(u->frozen_bytes);
    b.model_trainable += u->trainable_numel * static_cast<int64_t>(sizeof(float));
    b.frozen += static_cast<int64_t>(resident() ? u->frozen_bytes : u->frozen_shard_bytes);
    b.trainable += u->shard_numel * static_cast<int64_t>(sizeof(float));
  }
  return b;
}

CommTimes ShardedParameters::take_times() { return std::exchange(times_, {}); }

}  // namespace fsdpq
