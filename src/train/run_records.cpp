#include "train/run_records.h"

#include <omp.h>

#include <chrono>
#include <thread>

#include "backend/cuda_backend.h"
#include "runtime/host_memory.h"

namespace fsdpq {

nlohmann::json run_header(const ResolvedConfig& resolved, const RunPlan& plan, const World& world,
                          const GpuInfo& gpu, int64_t total_steps) {
  nlohmann::json config = nlohmann::json::object();
  for (const auto& [key, value] : resolved.text) config[key] = value;
  const auto& m = plan.trained_model;
  return {
      {"type", "header"},
      {"fsdpq_version", FSDPQ_VERSION},
      {"config_file", resolved.config_path},
      {"config", config},
      {"model",
       {{"name", plan.model.name},
        {"hidden_size", m.hidden_size},
        {"intermediate_size", m.intermediate_size},
        {"num_hidden_layers", m.num_hidden_layers},
        {"num_attention_heads", m.num_attention_heads},
        {"num_key_value_heads", m.num_key_value_heads},
        {"vocab_size", m.vocab_size},
        {"llama_pro_new_blocks", plan.trained_model.num_hidden_layers - plan.model.config.num_hidden_layers},
        {"parameters", plan.footprint.params.total},
        {"trainable_parameters", plan.footprint.trainable_params}}},
      {"dataset",
       {{"train_examples", plan.dataset.train.size()},
        // All of them, or those the run reads (only those are tokenized): the target tokens are theirs.
        {"train_examples_tokenized", plan.dataset.train.tokenized()},
        {"eval_examples", plan.dataset.eval.size()},
        {"target_tokens", plan.dataset.stats.target_tokens}}},
      {"world_size", world.size},
      {"nodes", world.num_nodes},
      {"launcher", world.launcher},
      {"host", world.hostname},
      // What the host's parallel loops (the CPU-offload update above all) run on: the OpenMP
      // team size and the CPUs this process may use.
      {"host_threads", omp_get_max_threads()},
      {"host_cpus", std::thread::hardware_concurrency()},
      {"device", gpu.has_gpu() ? gpu.name : "cpu"},
      {"total_steps", total_steps},
      {"start_unix_time", std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count()},
  };
}

nlohmann::json memory_record(const char* at, int64_t step, Device device) {
  const HostMemory host = host_memory();
  nlohmann::json r = {{"type", "memory"},
                      {"at", at},
                      {"step", step},
                      {"host_private_bytes", host.private_now},
                      {"host_peak_resident_bytes", host.peak_resident}};
  if (device == Device::CUDA) {
    const MemoryStats m = cuda_memory_stats();
    r["allocated_bytes"] = m.allocated;
    r["reserved_bytes"] = m.reserved;
    r["peak_allocated_bytes"] = m.peak_allocated;
    r["peak_reserved_bytes"] = m.peak_reserved;
    // Cache misses so far (each a synchronising cudaMalloc) and hits: a step that still misses
    // after the first is slower than its neighbours.
    r["device_allocations"] = m.device_allocations;
    r["cache_hits"] = m.cache_hits;
  }
  return r;
}

}  // namespace fsdpq
