#include "dist/fsdp_engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <new>
#include <stdexcept>

#include "backend/cuda_backend.h"
#include "dist/frozen_layout.h"
#include "dist/frozen_offload.h"
#include "model/llama_weights.h"
#include "ops/elementwise.h"
#include "ops/parallel.h"
#include "optim/clip.h"
#include "optim/device_grads.h"
#include "optim/device_optimizer.h"
#include "runtime/watchdog.h"
#include "runtime/host_out_of_memory.h"
#include "util/bf16.h"

namespace fsdpq {
namespace {

size_t round_up(size_t n, size_t multiple) { return (n + multiple - 1) / multiple * multiple; }

struct TrainableEntry {
  TrainableTensor* tensor = nullptr;
  std::string name;
  Shape shape;
  int64_t offset = 0, numel = 0;  // elements within the unit's flat trainable vector
};

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
    throw std::logic_error("FsdpEngine: compute dtype must be F32, BF16 or F16");
  }
}

// g *= f over a host gradient shard, multi-threaded (clipping's scale of every gradient).
void scale_host(std::vector<float>& grad, float f) {
  float* g = grad.data();
  const int64_t n = static_cast<int64_t>(grad.size());
#pragma omp parallel for if (worth_parallel(n)) schedule(static)
  for (int64_t i = 0; i < n; ++i) g[i] *= f;
}

// Writes a tensor's bytes with `write(host_bytes)`: in place on the CPU, through a host staging
// buffer for a device tensor (the engine's shards and messages are host memory).
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

}  // namespace

struct FsdpEngine::Unit {
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

  // What this rank sends to a gather (non-resident only): [frozen shard | compute shard],
  // chunk_bytes at `send`, on the GPU when the shard's state is there (send_on_device), else in
  // host memory (send_on_host, page-locked once CUDA runs: the CPU backend, use_cpu_offload).
  Tensor send_on_device;
  HostStaging send_on_host;
  uint8_t* send = nullptr;
  Device send_device = Device::CPU;

  // This rank's shard. With state on the GPU, master_d / grad_d / device_optimizer hold it and
  // `master` is a host staging copy, refreshed where host code reads it (checkpoints, gathers).
  std::vector<float> master, grad;
  std::unique_ptr<ShardOptimizer> optimizer;
  Tensor master_d, grad_d;
  std::unique_ptr<DeviceShardOptimizer> device_optimizer;

  bool state_on_device() const { return device_optimizer != nullptr; }
  int64_t optimizer_steps() const { return state_on_device() ? device_optimizer->step_count() : optimizer->step_count(); }
  void master_to_host() {
    if (state_on_device()) copy_bytes(master.data(), Device::CPU, master_d.view().data, Device::CUDA, master.size() * sizeof(float));
  }
  void master_to_device() {
    if (state_on_device()) copy_bytes(master_d.view().data, Device::CUDA, master.data(), Device::CPU, master.size() * sizeof(float));
  }
  GradBuffer grad_buffer() {
    return state_on_device() ? GradBuffer{grad_d.data<float>(), grad_d.numel()}
                             : GradBuffer{grad.data(), static_cast<int64_t>(grad.size())};
  }

  // Gathering, on the model's device: the gather's output until unpacked, and a host-homed
  // shard's copy on the GPU for the gather in flight.
  Tensor recv, send_copy;
  CollectiveHandle pending;
  bool gathered = false;       // the model's tensors hold the full parameters
  bool grads_present = false;  // the model's gradient tensors are allocated (and accumulate)

  int64_t shard_offset(int shard_rank) const { return shard_numel * shard_rank; }

  // offload_frozen: the frozen weights' host copy and their presence on the device.
  std::unique_ptr<OffloadedFrozen> offloaded;
  // overlap_host_optimizer: the gradients copied out (fp32) and the compute copies going back in
  // (page-locked), and what the worker did in a step taken during backward.
  HostStaging grads_out, compute_in;
  bool stepped = false;   // stepped during this step's backward (worker)
  bool measured = false;  // grad_sq (and found_inf) hold this step's gradient, measured on the worker
  bool found_inf = false;
  double grad_sq = 0;         // the sum of squares of the gradient the step uses
  uint64_t step_ticket = 0;   // the worker job updating this unit, until waited for
  uint64_t accumulate_ticket = 0;  // the last worker job reading grads_out
  // `grad` holds zeros: since it was made, zeroed, or stepped with (the fused update zeroes it).
  bool grad_zero = true;
  // The step's gradient where it was copied out (grads_out) instead of added into `grad`, which
  // still holds zeros: a step's only micro-batch on one rank, measured on the worker. Its update
  // reads it there, which saves a write and a read of `grad` and its zeroing (12 of the 46 bytes
  // per parameter the worker moves; bench/RESULTS.md, "CPU offload").
  float* staged_gradient = nullptr;
  float* step_gradient() { return staged_gradient ? staged_gradient : grad.data(); }
  StreamMark uploaded;   // the new compute copies are in the model's tensors
};

namespace {

// The tensor a gathered trainable computes with: the master itself in fp32, else the compute copy.
Tensor& compute_tensor(TrainableTensor& t, DType dtype) { return dtype == DType::F32 ? t.master : t.compute; }

}  // namespace

FsdpEngine::FsdpEngine(ProcessGroups& groups, FsdpOptions options, int num_units)
    : groups_(groups),
      options_(std::move(options)),
      reshard_after_forward_(reshards_after_forward(groups.strategy)),
      last_layer_unit_(num_units - 1) {
  if (options_.compute_dtype != DType::F32 && options_.compute_dtype != DType::BF16 &&
      options_.compute_dtype != DType::F16)
    throw std::logic_error("FsdpEngine: compute dtype must be F32, BF16 or F16");
  for (int i = 0; i < num_units; ++i) {
    units_.push_back(std::make_unique<Unit>());
    units_.back()->index = i;
  }
}

FsdpEngine::~FsdpEngine() = default;

bool FsdpEngine::resident() const { return groups_.shard->size() == 1; }
bool FsdpEngine::is_writer() const { return groups_.replicate->rank() == 0; }

FsdpEngine::Unit& FsdpEngine::unit(int index) {
  if (index < 0 || index >= static_cast<int>(units_.size()))
    throw std::logic_error(fmt::format("FsdpEngine: no unit {}", index));
  return *units_[static_cast<size_t>(index)];
}

void FsdpEngine::record_layout(Unit& u, ParamUnit& contents, const UnitLayout& layout) {
  if (u.adopted) throw std::logic_error(fmt::format("FsdpEngine: unit {} adopted twice", u.index));
  if (contents.trainable.size() != layout.trainable_offset.size())
    throw std::logic_error(fmt::format("FsdpEngine: unit {}'s layout does not match its tensors", u.index));
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

void FsdpEngine::init_shard_state(Unit& u) {
  if (options_.state_device == Device::CUDA) {
    u.master_d = copy_to(TensorView{u.master.data(), DType::F32, Shape{u.shard_numel}, Device::CPU}, Device::CUDA);
    u.grad_d = Tensor::zeros(Shape{u.shard_numel}, DType::F32, Device::CUDA);
    u.device_optimizer = std::make_unique<DeviceShardOptimizer>(options_.optimizer, u.shard_numel);
  } else {
    try {
      u.grad.assign(static_cast<size_t>(u.shard_numel), 0.0f);
      u.optimizer = std::make_unique<ShardOptimizer>(options_.optimizer, u.shard_numel);
    } catch (const std::bad_alloc&) {
      const size_t buffers = 1 + optimizer_state_names(options_.optimizer.kind).size();
      fail_host_allocation(buffers * static_cast<size_t>(u.shard_numel) * sizeof(float),
                           fmt::format("the fp32 gradient and {} optimizer state of a shard of {} parameters",
                                       optimizer_kind_name(options_.optimizer.kind), u.shard_numel));
    }
  }
}

void FsdpEngine::adopt_unit(int index, ParamUnit& contents) {
  watchdog_progress();
  Unit& u = unit(index);
  const int s = groups_.shard->rank();
  const UnitLayout layout = unit_layout(contents, groups_.shard->size());
  record_layout(u, contents, layout);

  // This rank's master shard (zeros past the end: padding that never changes).
  try {
    u.master.assign(static_cast<size_t>(u.shard_numel), 0.0f);
  } catch (const std::bad_alloc&) {
    fail_host_allocation(static_cast<size_t>(u.shard_numel) * sizeof(float),
                         fmt::format("the fp32 master of a shard of {} parameters", u.shard_numel));
  }
  const int64_t begin = u.shard_offset(s), end = begin + u.shard_numel;
  for (const TrainableEntry& e : u.trainables) {
    const int64_t lo = std::max(begin, e.offset), hi = std::min(end, e.offset + e.numel);
    if (lo < hi)
      std::memcpy(u.master.data() + (lo - begin), e.tensor->master.data<float>() + (lo - e.offset),
                  static_cast<size_t>(hi - lo) * sizeof(float));
  }
  init_shard_state(u);

  if (resident()) {
    // The engine's master is the only fp32 copy the optimizer steps; the model keeps what it computes with.
    for (const TrainableEntry& e : u.trainables) {
      if (options_.compute_dtype != DType::F32) e.tensor->master = Tensor();
      e.tensor->grad = Tensor();
    }
    u.gathered = true;
    // The root (embedding, final norm, head) is used at both ends of every pass: it stays.
    if (options_.offload_frozen && index != kRootUnit && !u.frozen.empty())
      u.offloaded = std::make_unique<OffloadedFrozen>(contents, options_.device);
    return;
  }

  // Keep this rank's slice of the frozen bytes and its compute shard; free the unit.
  std::vector<uint8_t> chunk(u.chunk_bytes, 0);
  copy_frozen_bytes(layout, contents, layout.frozen_begin(s), chunk.data(), u.frozen_shard_bytes);
  store_compute(options_.compute_dtype, u.master.data(), u.shard_numel, chunk.data() + u.frozen_shard_bytes);
  keep_send(u, chunk);
  for (BaseWeight* w : u.frozen) evict_frozen_storage(*w);
  for (const TrainableEntry& e : u.trainables) {
    e.tensor->master = Tensor();
    e.tensor->compute = Tensor();
    e.tensor->grad = Tensor();
  }
  u.gathered = false;
}

void FsdpEngine::adopt_unit_shard(int index, ParamUnit& skeleton, const UnitLayout& layout,
                                  std::vector<uint8_t> frozen_shard,
                                  std::vector<float> master_shard) {
  if (resident()) throw std::logic_error("FsdpEngine: a shard group of one keeps whole units (adopt_unit)");
  watchdog_progress();
  if (frozen_shard.size() != layout.frozen_shard_bytes || master_shard.size() != static_cast<size_t>(layout.shard_numel))
    throw std::logic_error(fmt::format("FsdpEngine: unit {}'s shard does not match its layout", index));
  Unit& u = unit(index);
  record_layout(u, skeleton, layout);
  u.master = std::move(master_shard);
  init_shard_state(u);
  frozen_shard.resize(u.chunk_bytes, 0);
  store_compute(options_.compute_dtype, u.master.data(), u.shard_numel, frozen_shard.data() + u.frozen_shard_bytes);
  keep_send(u, frozen_shard);
  u.gathered = false;
}

std::vector<uint8_t> FsdpEngine::frozen_shard(int index) {
  Unit& u = unit(index);
  if (resident()) return {};
  std::vector<uint8_t> bytes(u.frozen_shard_bytes);
  copy_bytes(bytes.data(), Device::CPU, u.send, u.send_device, bytes.size());
  return bytes;
}

void FsdpEngine::keep_send(Unit& u, const std::vector<uint8_t>& chunk) {
  const int64_t n = static_cast<int64_t>(u.chunk_bytes);
  u.send_device = options_.device == Device::CUDA && options_.state_device == Device::CUDA ? Device::CUDA : Device::CPU;
  if (u.send_device == Device::CUDA) {
    u.send_on_device = Tensor::empty(Shape{n}, DType::U8, Device::CUDA);
    u.send = static_cast<uint8_t*>(u.send_on_device.view().data);
  } else {
    u.send = static_cast<uint8_t*>(u.send_on_host.reserve(u.chunk_bytes));
  }
  copy_bytes(u.send, u.send_device, chunk.data(), Device::CPU, u.chunk_bytes);
}

Communicator& FsdpEngine::gather_comm() {
  if (options_.device == Device::CPU) return *groups_.shard;
  if (!groups_.shard_device)
    throw std::logic_error("FsdpEngine: a sharded model on the GPU needs the shard group's device collectives");
  return *groups_.shard_device;
}

Communicator* FsdpEngine::replicate_comm() {
  if (groups_.replicate->size() == 1) return nullptr;
  if (options_.device == Device::CPU) return groups_.replicate.get();
  if (!groups_.replicate_device)
    throw std::logic_error("FsdpEngine: a replicated model on the GPU needs the replicate group's device collectives");
  return groups_.replicate_device.get();
}

float* FsdpEngine::comm_scratch(HostStaging& host, Tensor& holder, size_t n) {
  if (options_.device == Device::CPU) return static_cast<float*>(host.reserve(n * sizeof(float)));
  holder = Tensor::empty(Shape{static_cast<int64_t>(n)}, DType::F32, options_.device);
  return holder.data<float>();
}

std::span<const float> FsdpEngine::master_shard(int index) {
  settle_steps();
  Unit& u = unit(index);
  u.master_to_host();
  return {u.master.data(), u.master.size()};
}

void FsdpEngine::attach(LlamaModel& model) {
  std::vector<ParamUnit> units = model.param_units();
  if (units.size() != units_.size())
    throw std::logic_error(fmt::format("FsdpEngine: model has {} units, engine {}", units.size(), units_.size()));
  for (size_t i = 0; i < units.size(); ++i) {
    Unit& u = *units_[i];
    if (!u.adopted) throw std::logic_error(fmt::format("FsdpEngine: unit {} was never adopted", i));
    // The root's weights are members of the model, which moved since it was built: rebind by position.
    if (units[i].frozen.size() != u.frozen.size() || units[i].trainable.size() != u.trainables.size())
      throw std::logic_error(fmt::format("FsdpEngine: unit {} changed its tensors", i));
    for (size_t k = 0; k < u.frozen.size(); ++k) u.frozen[k] = units[i].frozen[k];
    for (size_t k = 0; k < u.trainables.size(); ++k) {
      if (units[i].trainable[k]->name != u.trainables[k].name)
        throw std::logic_error(fmt::format("FsdpEngine: unit {} tensor {} is now '{}', was '{}'", i, k,
                                           units[i].trainable[k]->name, u.trainables[k].name));
      u.trainables[k].tensor = units[i].trainable[k];
    }
    if (u.offloaded) u.offloaded->rebind(u.frozen);
  }
  if (resident() && options_.offload_frozen) frozen_copies_ = std::make_unique<SideStream>(options_.device);
  // One rank only: with more (ddp, or hybrid over nodes of one rank) the gradients are all-reduced
  // on the main thread before any update, as reduce_gradients does.
  overlap_ = groups_.world->size() == 1 && options_.overlap_host_optimizer && options_.state_device == Device::CPU;
  if (overlap_) {
    grad_copies_ = std::make_unique<SideStream>(options_.device);
    upload_copies_ = std::make_unique<SideStream>(options_.device);
    worker_ = std::make_unique<WorkerThread>(follow_current_gpu());
    // The staging buffers are sized once here: the worker thread never allocates.
    const size_t element = dtype_size(options_.compute_dtype);
    for (auto& up : units_) {
      up->grads_out.reserve(static_cast<size_t>(up->shard_numel) * sizeof(float));
      up->compute_in.reserve(static_cast<size_t>(up->trainable_numel) * element);
    }
  }
  model.set_unit_hooks(this);
}

void FsdpEngine::start_gather(Unit& u) {
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

void FsdpEngine::ensure_gathered(Unit& u) {
  if (u.gathered) return;
  start_gather(u);
  const auto waited = std::chrono::steady_clock::now();
  u.pending.wait();
  const auto waited_until = std::chrono::steady_clock::now();
  times_.gather_wait += std::chrono::duration<double>(waited_until - waited).count();
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
    Tensor& t = compute_tensor(*e.tensor, options_.compute_dtype);
    t = Tensor::empty(e.shape, options_.compute_dtype, device);
    copy_from_pieces(recv + u.frozen_shard_bytes, u.chunk_bytes, piece, static_cast<size_t>(e.offset) * element,
                     static_cast<uint8_t*>(t.view().data), static_cast<size_t>(e.numel) * element, device);
  }
  u.recv = Tensor();
  u.send_copy = Tensor();
  u.gathered = true;
}

void FsdpEngine::release(Unit& u) {
  if (resident()) return;
  if (u.pending.pending()) u.pending.wait();
  u.recv = Tensor();
  u.send_copy = Tensor();
  if (!u.gathered) return;
  for (BaseWeight* w : u.frozen) evict_frozen_storage(*w);
  for (const TrainableEntry& e : u.trainables) compute_tensor(*e.tensor, options_.compute_dtype) = Tensor();
  u.gathered = false;
}

void FsdpEngine::prefetch(int index) {
  if (resident() || index < 0 || index >= static_cast<int>(units_.size())) return;
  start_gather(unit(index));
}

void FsdpEngine::fetch_frozen(int index) {
  if (index < 0 || index >= static_cast<int>(units_.size())) return;
  Unit& u = unit(index);
  if (u.offloaded) u.offloaded->fetch(*frozen_copies_);
}

void FsdpEngine::forward_begin(int index) {
  watchdog_progress();
  Unit& u = unit(index);
  wait_for_step(u);
  ensure_gathered(u);
  prefetch(index + 1);
  if (u.offloaded) u.offloaded->ensure(*frozen_copies_);
  fetch_frozen(index + 1);
}

void FsdpEngine::forward_end(int index, bool backward_follows) {
  Unit& u = unit(index);
  // An offloaded unit leaves the device after its forward, except the last layer, whose backward
  // comes next.
  if (u.offloaded && !(backward_follows && index == last_layer_unit_)) u.offloaded->evict();
  // The root stays for the whole step; the last layer's backward comes next, so it stays too.
  if (backward_follows && (!reshard_after_forward_ || index == kRootUnit || index == last_layer_unit_)) return;
  release(u);
}

void FsdpEngine::backward_begin(int index) {
  // The root's backward begins with the loss: the forward of this pass is complete.
  if (index == kRootUnit && forward_done_) forward_done_();
  Unit& u = unit(index);
  wait_for_step(u);
  ensure_gathered(u);
  if (index > 1 && reshard_after_forward_) prefetch(index - 1);
  if (u.offloaded) u.offloaded->ensure(*frozen_copies_);
  if (index > 1) fetch_frozen(index - 1);
  if (!u.grads_present) {
    for (const TrainableEntry& e : u.trainables) e.tensor->grad = Tensor::zeros(e.shape, DType::F32, options_.device);
    u.grads_present = true;
  }
}

void FsdpEngine::backward_end(int index) {
  watchdog_progress();
  Unit& u = unit(index);
  if (sync_gradients_) reduce_gradients(u);
  release(u);
  if (u.offloaded) u.offloaded->evict();
}

void FsdpEngine::reduce_gradients(Unit& u) {
  if (!u.grads_present) return;
  if (overlap_) {
    reduce_gradients_on_worker(u);
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  // The average over every rank's micro-batch, as FSDP and DDP average gradients.
  const float inv_world = 1.0f / static_cast<float>(groups_.world->size());
  if (u.state_on_device() && groups_.world->size() == 1) {
    // One GPU: nothing to communicate, so the gradients never leave the device.
    for (const TrainableEntry& e : u.trainables)
      add_scaled(u.grad_d.view().slice_rows(e.offset, e.numel), e.tensor->grad, inv_world);
  } else {
    // Packed, reduce-scattered over the shard group and all-reduced over the replicas where the
    // model computes (the device collectives on a GPU), then added to the shard's gradient.
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
    if (u.state_on_device()) {
      add_scaled(u.grad_d, TensorView{mine, DType::F32, Shape{u.shard_numel}, Device::CUDA}, inv_world);
    } else {
      if (device != Device::CPU) {
        // use_cpu_offload: the reduced shard comes to the host, where its state lives.
        const auto copies = std::chrono::steady_clock::now();
        auto* host = static_cast<float*>(offload_staging_.reserve(static_cast<size_t>(u.shard_numel) * sizeof(float)));
        copy_bytes(host, Device::CPU, mine, device, static_cast<size_t>(u.shard_numel) * sizeof(float));
        mine = host;
        times_.offload_copies += std::chrono::duration<double>(std::chrono::steady_clock::now() - copies).count();
      }
      float* grad = u.grad.data();
#pragma omp parallel for if (worth_parallel(u.shard_numel)) schedule(static)
      for (int64_t i = 0; i < u.shard_numel; ++i) grad[i] += mine[i] * inv_world;
      u.grad_zero = false;
    }
  }
  for (const TrainableEntry& e : u.trainables) e.tensor->grad = Tensor();
  u.grads_present = false;
  const auto end = std::chrono::steady_clock::now();
  times_.reduce += std::chrono::duration<double>(end - start).count();
  if (event_sink_) event_sink_("reduce", u.name, start, end);
}

void FsdpEngine::reduce_gradients_on_worker(Unit& u) {
  const auto start = std::chrono::steady_clock::now();
  // Copy out behind the unit's backward, on a side stream; the compute stream may reuse the
  // gradients' memory (freed below) only once the copy has read it.
  // The previous micro-batch's job may still be reading this unit's staging buffer, and so may the
  // last step's update (when it took its gradient from there; the forward waited for it already).
  if (u.accumulate_ticket) worker_->wait_for(u.accumulate_ticket);
  wait_for_step(u);
  // The whole shard: an update that reads its gradient here reads the padding past the trainables
  // too, zero as in `grad`.
  auto* staged = static_cast<float*>(u.grads_out.reserve(static_cast<size_t>(u.shard_numel) * sizeof(float)));
  std::fill(staged + u.trainable_numel, staged + u.shard_numel, 0.0f);
  grad_copies_->wait_for_compute();
  for (const TrainableEntry& e : u.trainables)
    grad_copies_->copy(staged + e.offset, Device::CPU, e.tensor->grad.view().data, e.tensor->grad.device(),
                       static_cast<size_t>(e.numel) * sizeof(float));
  const StreamMark copied = grad_copies_->mark();
  copied.compute_waits();
  for (const TrainableEntry& e : u.trainables) e.tensor->grad = Tensor();
  u.grads_present = false;
  const bool step = step_in_backward_, measure = measure_in_backward_;
  const DynamicLossScaler* scaler = measure_scaler_;
  const double lr = step_lr_;
  const float inv_world = 1.0f / static_cast<float>(groups_.world->size());
  u.accumulate_ticket = worker_->post([this, &u, staged, copied, step, measure, scaler, lr, inv_world] {
    const auto copy_wait = std::chrono::steady_clock::now();
    copied.host_wait();
    const auto work = std::chrono::steady_clock::now();
    if (event_sink_) event_sink_("host copy-out wait", u.name, copy_wait, work);
    struct Span {  // "host accumulate" from here to the job's end (the update, if any, is its own span)
      const FsdpEngine& engine;
      const Unit& unit;
      std::chrono::steady_clock::time_point begin;
      bool done = false;
      void end() {
        if (!done && engine.event_sink_) engine.event_sink_("host accumulate", unit.name, begin, std::chrono::steady_clock::now());
        done = true;
      }
      ~Span() { end(); }
    } span{*this, u, work};
    float* grad = u.grad.data();
    if (!step && !measure) {
#pragma omp parallel for if (worth_parallel(u.trainable_numel)) schedule(static)
      for (int64_t i = 0; i < u.trainable_numel; ++i) grad[i] += staged[i] * inv_world;
      u.grad_zero = false;
      return;
    }
    if (u.grad_zero && inv_world == 1.0f && !scaler) {
      // 0 + staged is staged: the gradient stays where it is, and only its sum of squares is taken
      // (the same values, the same order as accumulate_and_sq_sum's; the padding past the
      // trainables is zero in `grad` and adds nothing).
      u.grad_sq = grad_sq_sum(staged, u.trainable_numel);
      u.staged_gradient = staged;
      u.found_inf = false;
      u.measured = measure;
      span.end();
      if (step) step_on_worker(u, lr, 1.0f);
      return;
    }
    // The step's last gradient: accumulated, unscaled (fp16) and measured in one pass — what
    // unscale_grads and grad_norm compute on the main thread otherwise, the same way (the
    // elements past the trainables are padding, always zero, and add nothing).
    bool found_inf = false;
    u.grad_sq = scaler ? accumulate_and_sq_sum(grad, staged, inv_world, u.trainable_numel, scaler->inv_scale(), &found_inf)
                       : accumulate_and_sq_sum(grad, staged, inv_world, u.trainable_numel);
    u.found_inf = found_inf;
    u.measured = measure;
    u.grad_zero = false;
    span.end();
    if (step) step_on_worker(u, lr, 1.0f);
  });
  const auto end = std::chrono::steady_clock::now();
  times_.reduce += std::chrono::duration<double>(end - start).count();
  if (event_sink_) event_sink_("reduce", u.name, start, end);
}

// On the worker thread: the unit's update (its gradient scaled by `grad_scale` first, as
// scale_grads would), then its new compute copies into the model's tensors (which the GPU no
// longer reads this step: the unit's backward is done). One pass over the shard's memory.
void FsdpEngine::step_on_worker(Unit& u, double lr, float grad_scale) {
  const auto start = std::chrono::steady_clock::now();
  const size_t element = dtype_size(options_.compute_dtype);
  auto* compute = static_cast<uint8_t*>(u.compute_in.reserve(static_cast<size_t>(u.trainable_numel) * element));
  StepFusion fusion;
  fusion.grad_scale = grad_scale;
  fusion.zero_grad = u.staged_gradient == nullptr;  // a staged gradient left `grad` at zero
  fusion.compute = compute;
  fusion.compute_dtype = options_.compute_dtype;
  fusion.compute_numel = u.trainable_numel;
  u.optimizer->step(u.master.data(), u.step_gradient(), lr, fusion);
  u.staged_gradient = nullptr;
  u.grad_zero = true;
  for (const TrainableEntry& e : u.trainables) {
    Tensor& t = compute_tensor(*e.tensor, options_.compute_dtype);
    upload_copies_->copy(t.view().data, t.device(), compute + static_cast<size_t>(e.offset) * element, Device::CPU,
                         static_cast<size_t>(e.numel) * element);
  }
  u.uploaded = upload_copies_->mark();
  u.stepped = true;
  if (event_sink_) event_sink_("host update", u.name, start, std::chrono::steady_clock::now());
}

void FsdpEngine::drain_worker() {
  if (worker_) worker_->drain();
}

bool FsdpEngine::can_step_during_backward() const { return overlap_; }

void FsdpEngine::step_during_backward(double lr) {
  if (!overlap_) throw std::logic_error("FsdpEngine: step_during_backward needs overlap_host_optimizer on whole units");
  step_in_backward_ = true;
  step_lr_ = lr;
}

bool FsdpEngine::stepped_during_backward() const { return step_in_backward_; }

void FsdpEngine::measure_during_backward(const DynamicLossScaler* scaler) {
  if (!overlap_) throw std::logic_error("FsdpEngine: measure_during_backward needs overlap_host_optimizer on whole units");
  measure_in_backward_ = true;
  measure_scaler_ = scaler;
}

void FsdpEngine::wait_for_step(Unit& u) {
  if (u.step_ticket == 0) return;
  const uint64_t ticket = u.step_ticket;
  u.step_ticket = 0;
  const auto start = std::chrono::steady_clock::now();
  worker_->wait_for(ticket);
  if (event_sink_) event_sink_("update wait", u.name, start, std::chrono::steady_clock::now());
  u.uploaded.compute_waits();
  u.uploaded = {};
  u.stepped = false;
}

void FsdpEngine::settle_steps() {
  drain_worker();
  for (auto& u : units_) wait_for_step(*u);
}

CommTimes FsdpEngine::take_times() {
  CommTimes t = times_;
  if (worker_) t.host_worker = worker_->take_busy_seconds();
  times_ = {};
  return t;
}

double FsdpEngine::grad_norm() {
  const auto start = std::chrono::steady_clock::now();
  settle_steps();
  if (event_sink_ && worker_) event_sink_("norm wait", "all units", start, std::chrono::steady_clock::now());
  if (stepped_during_backward() || measure_in_backward_) {
    // The units the worker measured (before stepping them, if it did) add what it found; the
    // others (no backward this step) what they hold. Unit by unit, in order, as below.
    double sq = 0;
    for (auto& u : units_)
      sq += u->stepped || u->measured ? u->grad_sq : grad_sq_sum(u->grad_buffer().data, u->grad_buffer().numel);
    return std::sqrt(groups_.shard->all_reduce_sum(sq));
  }
  std::vector<GradBuffer> grads;
  for (auto& u : units_) grads.push_back(u->grad_buffer());
  const bool on_device = options_.state_device == Device::CUDA;
  return std::sqrt(groups_.shard->all_reduce_sum(on_device ? device_grad_sq_sum(grads) : grad_sq_sum(grads)));
}

void FsdpEngine::before_last_micro_batch(const StepRequest& request) {
  if (!can_step_during_backward()) return;
  if (!request.scaler && !request.clip_to_norm)
    step_during_backward(request.lr);
  else  // each unit unscaled and measured as it completes; the updates follow in the next pass
    measure_during_backward(request.scaler);
}

StepOutcome FsdpEngine::step(const StepRequest& request) {
  StepOutcome out;
  // fp16: unscale, and skip the step when any gradient overflowed (the scale backs off).
  if (request.scaler) out.skipped = !request.scaler->update(unscale_grads(*request.scaler));
  out.grad_norm = out.skipped ? std::nan("") : grad_norm();
  if (!out.skipped && !std::isfinite(out.grad_norm)) {
    out.diverged_at = first_non_finite_gradient();
    return out;
  }
  if (!out.skipped && request.clip_to_norm) {
    const double coefficient = clip_coefficient(out.grad_norm, *request.clip_to_norm);
    if (coefficient < 1.0) scale_grads(coefficient);
  }
  if (out.skipped)
    skip_step();
  else
    optimizer_step(request.lr);
  return out;
}

std::string FsdpEngine::first_non_finite_gradient() {
  settle_steps();
  // Where, as unit × (entries + 1) + entry, with entry = entries for "somewhere in the unit".
  constexpr double kNone = 1e300;
  double where = kNone;
  const int s = groups_.shard->rank();
  for (size_t ui = 0; ui < units_.size() && where == kNone; ++ui) {
    Unit& u = *units_[ui];
    const double base = static_cast<double>(ui) * static_cast<double>(u.trainables.size() + 1);
    if (u.stepped) {  // the fused update consumed (and zeroed) the gradient
      if (!std::isfinite(u.grad_sq)) where = base + static_cast<double>(u.trainables.size());
      continue;
    }
    std::vector<float> on_host;
    const float* grad = u.step_gradient();
    if (u.state_on_device()) {
      on_host.resize(static_cast<size_t>(u.grad_d.numel()));
      copy_bytes(on_host.data(), Device::CPU, u.grad_d.view().data, Device::CUDA, on_host.size() * sizeof(float));
      grad = on_host.data();
    }
    const int64_t begin = u.shard_offset(s), end = begin + u.shard_numel;
    for (size_t ei = 0; ei < u.trainables.size() && where == kNone; ++ei) {
      const TrainableEntry& e = u.trainables[ei];
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

void FsdpEngine::scale_grads(double factor) {
  settle_steps();
  if (stepped_during_backward()) throw std::logic_error("FsdpEngine: clipping after a step taken during backward");
  const float f = static_cast<float>(factor);
  if (measure_in_backward_) {
    clip_factor_ = f;  // each unit's queued update scales its gradient first
    return;
  }
  for (auto& u : units_) {
    if (u->state_on_device()) {
      device_scale(u->grad_d.data<float>(), u->grad_d.numel(), f);
    } else {
      scale_host(u->grad, f);
    }
  }
}

bool FsdpEngine::unscale_grads(const DynamicLossScaler& scaler) {
  settle_steps();
  if (stepped_during_backward()) throw std::logic_error("FsdpEngine: loss scaling with a step taken during backward");
  if (measure_in_backward_ && measure_scaler_ == &scaler) {
    bool found = false;
    for (auto& u : units_) {
      if (!u->measured) found |= scaler.unscale(u->grad.data(), static_cast<int64_t>(u->grad.size()));
      found |= u->found_inf;
    }
    return groups_.world->all_reduce_max(found ? 1.0 : 0.0) > 0.0;
  }
  std::vector<GradBuffer> grads;
  for (auto& u : units_) grads.push_back(u->grad_buffer());
  bool found = false;
  if (options_.state_device == Device::CUDA) {
    found = device_unscale(grads, scaler);
  } else {
    for (const GradBuffer& g : grads) found |= scaler.unscale(g.data, g.numel);
  }
  return groups_.world->all_reduce_max(found ? 1.0 : 0.0) > 0.0;
}

void FsdpEngine::skip_step() {
  settle_steps();
  if (stepped_during_backward()) throw std::logic_error("FsdpEngine: skipping a step taken during backward");
  for (auto& u : units_) {
    if (u->grads_present) throw std::logic_error("FsdpEngine: skipped step with gradients not yet reduced");
    zero_grad_shard(*u);
    u->measured = u->found_inf = false;
  }
  measure_in_backward_ = false;
  measure_scaler_ = nullptr;
  clip_factor_.reset();
}

void FsdpEngine::zero_grad_shard(Unit& u) {
  if (u.state_on_device())
    device_fill_zero(u.grad_d.data<float>(), u.grad_d.numel());
  else
    std::fill(u.grad.begin(), u.grad.end(), 0.0f);
  u.grad_zero = true;
  u.staged_gradient = nullptr;
}

void FsdpEngine::optimizer_step(double lr) {
  settle_steps();
  step_in_backward_ = false;
  const bool queue_updates = measure_in_backward_;
  measure_in_backward_ = false;
  measure_scaler_ = nullptr;
  const std::optional<float> clip = clip_factor_;
  clip_factor_.reset();
  // The queued updates overwrite compute copies the GPU may still be reading in queued work.
  if (queue_updates) upload_copies_->wait(mark_compute());
  for (auto& up : units_) {
    Unit& u = *up;
    u.measured = u.found_inf = false;
    if (u.pending.pending()) release(u);  // no gather may read a shard while it changes
    if (u.grads_present) throw std::logic_error("FsdpEngine: optimizer step with gradients not yet reduced");
    if (u.stepped) continue;  // on the worker, during backward
    if (queue_updates && u.trainable_numel > 0) {
      // In forward order (the units' order): the next pass waits for each only when it gets there.
      u.step_ticket = worker_->post([this, &u, clip, lr] { step_on_worker(u, lr, clip.value_or(1.0f)); });
      continue;
    }
    if (u.state_on_device())
      u.device_optimizer->step(u.master_d.data<float>(), u.grad_d.data<float>(), lr);
    else
      u.optimizer->step(u.master.data(), u.step_gradient(), lr);
    zero_grad_shard(u);
  }
  refresh_compute_copies();
  for (auto& up : units_) {
    if (up->step_ticket) continue;  // still queued: forward_begin waits for it
    // The next pass computes with the compute copies the worker sent.
    up->uploaded.compute_waits();
    up->uploaded = {};
    up->stepped = false;
  }
}

int64_t FsdpEngine::optimizer_steps() const { return units_.empty() ? 0 : units_.front()->optimizer_steps(); }

void FsdpEngine::masters_loaded(int64_t optimizer_steps) {
  settle_steps();
  for (auto& u : units_) {
    const nlohmann::json state = optimizer_state_json(options_.optimizer.kind, optimizer_steps, u->shard_numel);
    if (u->state_on_device())
      u->device_optimizer->load_state_json(state);
    else
      u->optimizer->load_state_json(state);
  }
  refresh_compute_copies();
}

void FsdpEngine::refresh_compute_copies() {
  const auto start = std::chrono::steady_clock::now();
  const bool copies = options_.device != Device::CPU && options_.state_device == Device::CPU;
  for (auto& up : units_) {
    Unit& u = *up;
    if (u.stepped || u.step_ticket) continue;  // the worker sends (or sent) this unit's compute copies
    if (resident()) {
      // The model computes with these tensors directly: write the new values into them.
      for (const TrainableEntry& e : u.trainables) {
        Tensor& t = compute_tensor(*e.tensor, options_.compute_dtype);
        if (u.state_on_device() && t.device() == Device::CUDA) {
          copy_convert(t.view().reshaped(Shape{e.numel}), u.master_d.view().slice_rows(e.offset, e.numel));
          continue;
        }
        u.master_to_host();
        write_tensor_bytes(t, write_staging_, [&](uint8_t* dst) {
          store_compute(options_.compute_dtype, u.master.data() + e.offset, e.numel, dst);
        });
      }
    } else {
      if (u.gathered) release(u);
      if (u.send_device == Device::CUDA) {
        device_store_compute(options_.compute_dtype, u.master_d.data<float>(), u.shard_numel, u.send + u.frozen_shard_bytes);
      } else {
        u.master_to_host();
        store_compute(options_.compute_dtype, u.master.data(), u.shard_numel, u.send + u.frozen_shard_bytes);
      }
    }
  }
  if (copies) times_.offload_copies += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void FsdpEngine::gather_masters_into_model() {
  settle_steps();
  const size_t S = static_cast<size_t>(groups_.shard->size());
  for (auto& up : units_) {
    Unit& u = *up;
    if (u.trainables.empty()) continue;
    const size_t piece = static_cast<size_t>(u.shard_numel) * sizeof(float);
    const size_t chunk = round_up(piece, Communicator::kAllGatherGranule);
    std::vector<uint8_t> send(chunk, 0), recv(chunk * S);
    u.master_to_host();
    std::memcpy(send.data(), u.master.data(), piece);
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

void FsdpEngine::for_each_trainable(const std::function<void(TrainableShard&)>& visit) {
  settle_steps();
  const int s = groups_.shard->rank();
  for (auto& up : units_) {
    Unit& u = *up;
    const int64_t begin = u.shard_offset(s), end = begin + u.shard_numel;
    // Visitors read (save) or write (load) host spans: state on the GPU is staged through host
    // copies, written back afterwards (checkpoints are rare; the copies are the shard's size).
    std::vector<std::vector<float>> staged;
    std::vector<std::span<float>> state;
    if (u.state_on_device()) {
      u.master_to_host();
      for (const auto& buffer : u.device_optimizer->state_buffers()) {
        staged.emplace_back(static_cast<size_t>(buffer.numel));
        u.device_optimizer->copy_state_to_host(staged.size() - 1, 0, staged.back());
        state.push_back(staged.back());
      }
    } else {
      for (auto& buffer : u.optimizer->state_buffers()) state.push_back(buffer.data);
    }
    for (const TrainableEntry& e : u.trainables) {
      const int64_t lo = std::max(begin, e.offset), hi = std::max(lo, std::min(end, e.offset + e.numel));
      const size_t at = static_cast<size_t>(std::min(lo, end) - begin), n = static_cast<size_t>(hi - lo);
      TrainableShard shard{e.name, e.shape, lo - e.offset, std::span<float>(u.master.data() + at, n), {}};
      for (auto& buffer : state) shard.state.push_back(buffer.subspan(at, n));
      visit(shard);
    }
    if (u.state_on_device()) {
      u.master_to_device();
      for (size_t b = 0; b < staged.size(); ++b) u.device_optimizer->copy_state_from_host(b, 0, staged[b]);
    }
  }
}

ShardBytes FsdpEngine::shard_bytes() const {
  ShardBytes b;
  for (const auto& u : units_) {
    b.model_frozen += static_cast<int64_t>(u->frozen_bytes);
    b.model_trainable += u->trainable_numel * static_cast<int64_t>(sizeof(float));
    b.frozen += static_cast<int64_t>(resident() ? u->frozen_bytes : u->frozen_shard_bytes);
    b.trainable += u->shard_numel * static_cast<int64_t>(sizeof(float));
  }
  return b;
}

}  // namespace fsdpq
