#include "train/train_checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>

#include "io/checkpoint_dir.h"
#include "io/checkpoint_file.h"
#include "train/base_fingerprint.h"
#include "runtime/agreed_errors.h"
#include "runtime/fault_injection.h"
#include "runtime/watchdog.h"
#include "runtime/log.h"
#include "util/error.h"

namespace fsdpq {
namespace {

constexpr int kTrainingCheckpointVersion = 1;

std::string state_dataset(const std::string& state, const std::string& tensor) { return state + ":" + tensor; }

std::vector<int64_t> dims_of(const Shape& shape) {
  return std::vector<int64_t>(shape.dims.begin(), shape.dims.begin() + shape.rank);
}

// What must match for a checkpoint to continue this run: the model's shape, what trains, and the
// meaning of the saved position (sample order and global batch). Learning rate, schedule, logging
// and the like may change between runs.
nlohmann::json compatibility(const TrainConfig& c, const RunPlan& plan) {
  const auto& m = plan.trained_model;  // with Llama-Pro's new blocks: the layers whose state is saved
  nlohmann::json j = {
      {"model",
       {{"hidden_size", m.hidden_size},
        {"intermediate_size", m.intermediate_size},
        {"num_hidden_layers", m.num_hidden_layers},
        {"num_attention_heads", m.num_attention_heads},
        {"num_key_value_heads", m.num_key_value_heads},
        {"vocab_size", m.vocab_size},
        {"tie_word_embeddings", m.tie_word_embeddings}}},
      {"train_type", c.is_lora() ? "lora" : c.llama_pro() ? "llama_pro" : "full"},
      {"lora", c.is_lora() ? nlohmann::json{{"rank", c.lora_rank}, {"alpha", c.lora_alpha},
                                            {"target_modules", c.lora_target_modules}}
                           : nlohmann::json(nullptr)},
      {"optimizer", c.optimizer},
      {"seed", c.seed},
      {"train_examples", plan.dataset.train.size()},
      {"global_batch", plan.batches.global_batch},
  };
  // With packing the saved position counts rows of context_length tokens (docs/packing.md).
  // (Recorded only when on, so checkpoints made before packing existed still continue unpacked runs.)
  if (c.packing) j["packing"] = {{"context_length", c.context_length}};
  return j;
}

// "lora.rank: checkpoint 8, this run 16" for the first difference between two JSON trees.
std::optional<std::string> first_difference(const nlohmann::json& saved, const nlohmann::json& now,
                                            const std::string& where) {
  if (saved.is_object() && now.is_object()) {
    for (auto it = now.begin(); it != now.end(); ++it) {
      const std::string key = where.empty() ? it.key() : where + "." + it.key();
      if (!saved.contains(it.key())) return fmt::format("{}: not in the checkpoint, this run {}", key, it.value().dump());
      if (auto d = first_difference(saved.at(it.key()), it.value(), key)) return d;
    }
    return std::nullopt;
  }
  if (saved == now) return std::nullopt;
  return fmt::format("{}: checkpoint {}, this run {}", where, saved.dump(), now.dump());
}

// Refuses a checkpoint that cannot continue this run (see check_training_checkpoint).
void check_can_continue(const nlohmann::json& meta, const std::filesystem::path& path, const ResolvedConfig& resolved,
                        const RunPlan& plan, const nlohmann::json& fingerprint) {
  const TrainConfig& c = resolved.config;
  if (meta.value("kind", "") != "fsdpq-training-checkpoint" || meta.value("version", 0) != kTrainingCheckpointVersion)
    fail("checkpoint '{}' is not a training checkpoint of this fsdpq (kind '{}', version {})", path.string(),
         meta.value("kind", "?"), meta.value("version", 0));
  if (meta.at("compatibility").contains("packing") && !c.packing)
    fail("checkpoint '{}' cannot continue this run: it was made with packing = true (its position counts packed "
         "rows); resume with packing = true",
         path.string());
  if (auto d = first_difference(meta.at("compatibility"), compatibility(c, plan), "")) {
    const std::string config_file = meta.value("config_file", "");
    fail("checkpoint '{}' cannot continue this run: {} (resume with the settings it was made with{})", path.string(),
         *d, config_file.empty() ? "" : fmt::format(", {}", config_file));
  }
  if (!meta.contains("base_fingerprint")) {
    log::warn("checkpoint '{}' records no fingerprint of its base weights and tokenizer (an older fsdpq made it): "
              "fsdpq cannot check that this run continues it on the same base", path.string());
    return;
  }
  if (auto d = fingerprint_difference(meta.at("base_fingerprint"), fingerprint)) {
    if (!c.resume_ignore_model)
      fail("checkpoint '{}' was made on another base than this run's: {}. Resume it with the model and tokenizer it "
           "was made with, or set resume_ignore_model = true to continue anyway",
           path.string(), *d);
    log::warn("checkpoint '{}' was made on another base than this run's: {}; continuing (resume_ignore_model = true)",
              path.string(), *d);
  }
}

}  // namespace

nlohmann::json run_base_fingerprint(const World& world, const RunPlan& plan) {
  std::string text;
  run_on_all_ranks(world, [&] {
    if (world.is_root()) text = base_fingerprint(plan.model, *plan.tokenizer).dump();
  });
  const WaitScope waiting("sharing the base fingerprint");
  uint64_t size = text.size();
  MPI_Bcast(&size, 1, MPI_UINT64_T, 0, world.comm);
  text.resize(size);
  MPI_Bcast(text.data(), static_cast<int>(size), MPI_CHAR, 0, world.comm);
  return nlohmann::json::parse(text);
}

void check_training_checkpoint(const World& world, const std::filesystem::path& path, const ResolvedConfig& resolved,
                               const RunPlan& plan, const nlohmann::json& fingerprint) {
  CheckpointReader reader(world.comm, path);
  check_can_continue(reader.meta(), path, resolved, plan, fingerprint);
  reader.verify();
}

std::optional<std::filesystem::path> checkpoint_to_resume(const TrainConfig& c) {
  if (c.resume.empty()) return std::nullopt;
  if (c.resume == "auto") return find_latest_checkpoint(c.checkpoint_dir);
  if (!std::filesystem::exists(c.resume)) fail("resume = '{}': no such checkpoint file", c.resume);
  return std::filesystem::path(c.resume);
}

std::filesystem::path save_training_checkpoint(const World& world, Fsdp& fsdp, const TrainingPosition& position,
                                               const ResolvedConfig& resolved, const RunPlan& plan,
                                               const nlohmann::json& fingerprint) {
  const TrainConfig& c = resolved.config;
  const auto start = std::chrono::steady_clock::now();
  const std::filesystem::path dir = c.checkpoint_dir;
  const std::string file = checkpoint_file_name(position.step);
  {
    CheckpointWriter writer(world.comm, dir / file);
    ShardedTrainingState& state = fsdp.state();
    const bool writes = state.is_writer();
    const std::vector<std::string> states = optimizer_state_names(c.choice.optimizer);
    size_t written = 0, total = 0;
    state.for_each_trainable([&](TrainableShard&) { ++total; });
    state.for_each_trainable([&](TrainableShard& t) {
      if (++written == total / 2 + 1) maybe_inject_fault(world, fmt::format("checkpoint_write_{}", position.step));
      const std::vector<int64_t> shape = dims_of(t.shape);
      auto slices = [&](std::span<float> values) {
        std::vector<FloatSlice> out;
        if (writes && !values.empty()) out.push_back({t.offset, values});
        return out;
      };
      writer.write_tensor(t.name, shape, slices(t.master));
      for (size_t k = 0; k < states.size(); ++k) writer.write_tensor(state_dataset(states[k], t.name), shape, slices(t.state[k]));
    });
    nlohmann::json config = nlohmann::json::object();
    for (const auto& [key, value] : resolved.text) config[key] = value;
    writer.commit({{"kind", "fsdpq-training-checkpoint"},
                   {"version", kTrainingCheckpointVersion},
                   {"fsdpq_version", FSDPQ_VERSION},
                   {"step", position.step},
                   {"epoch", position.epoch},
                   {"samples_in_epoch", position.samples_in_epoch},
                   {"first_loss", position.first_loss},
                   {"last_loss", position.last_loss},
                   {"optimizer_steps", state.optimizer_steps()},
                   {"optimizer_states", states},
                   {"loss_scaler", position.loss_scaler},
                   {"rng", {{"dropout", "keyed by (seed, step, micro-batch)"}, {"sampler", "keyed by (seed, epoch)"}}},
                   {"world_size", world.size},
                   {"sharding_strategy", c.sharding_strategy},
                   {"compatibility", compatibility(c, plan)},
                   {"base_fingerprint", fingerprint},
                   {"config_file", resolved.config_path},
                   {"config", config}});
  }
  if (world.is_root()) {
    mark_latest(dir, file);
    prune_checkpoints(dir, static_cast<int>(c.keep_last), file);
  }
  {
    const WaitScope waiting("waiting for rank 0 to mark the latest checkpoint");
    MPI_Barrier(world.comm);  // nobody returns (and perhaps exits) before `latest` is in place
  }
  log::info("checkpoint {} written in {:.1f} s", (dir / file).string(),
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return dir / file;
}

TrainingPosition load_training_checkpoint(const World& world, const std::filesystem::path& path, Fsdp& fsdp,
                                          const ResolvedConfig& resolved, const RunPlan& plan,
                                          const nlohmann::json& fingerprint) {
  const TrainConfig& c = resolved.config;
  CheckpointReader reader(world.comm, path);
  const nlohmann::json& meta = reader.meta();
  check_can_continue(meta, path, resolved, plan, fingerprint);
  reader.verify();

  const std::vector<std::string> states = optimizer_state_names(c.choice.optimizer);
  fsdp.state().for_each_trainable([&](TrainableShard& t) {
    const std::vector<int64_t> shape = dims_of(t.shape);
    auto read = [&](const std::string& name, std::span<float> out) {
      if (!reader.has_tensor(name))
        fail("checkpoint '{}' has no tensor '{}' that this run trains: it was made for another model or LoRA "
             "configuration", path.string(), name);
      if (reader.shape(name) != shape)
        fail("checkpoint '{}': tensor '{}' has shape [{}], this run's is {}", path.string(), name,
             fmt::join(reader.shape(name), ", "), t.shape.to_string());
      if (!out.empty()) reader.read(name, t.offset, out);
    };
    read(t.name, t.master);
    for (size_t k = 0; k < states.size(); ++k) read(state_dataset(states[k], t.name), t.state[k]);
  });
  fsdp.masters_loaded(meta.at("optimizer_steps").get<int64_t>());

  TrainingPosition p;
  p.step = meta.at("step").get<int64_t>();
  p.epoch = meta.at("epoch").get<int64_t>();
  p.samples_in_epoch = meta.at("samples_in_epoch").get<int64_t>();
  p.first_loss = meta.value("first_loss", 0.0);
  // Older checkpoints did not record it; JSON writes NaN as null.
  if (meta.contains("last_loss") && meta.at("last_loss").is_number()) p.last_loss = meta.at("last_loss").get<double>();
  if (meta.contains("loss_scaler")) p.loss_scaler = meta.at("loss_scaler");
  if (p.samples_in_epoch % world.size != 0)
    fail("checkpoint '{}' stopped {} samples into epoch {}, which {} ranks cannot split evenly", path.string(),
         p.samples_in_epoch, p.epoch, world.size);
  log::info("resuming from {} (made on {} ranks): step {}, epoch {}, {} samples into the epoch", path.string(),
            meta.value("world_size", 0), p.step, p.epoch, p.samples_in_epoch);
  return p;
}

}  // namespace fsdpq
