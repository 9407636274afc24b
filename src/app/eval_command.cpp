// `fsdpq eval CONFIG.ini [--adapter DIR] [--key value ...]`: one evaluation pass (loss and
// perplexity) of the configured model — with trained adapters when given — over the eval data
// (eval_data_path or eval_fraction), or over the training data when there is none; on the GPU
// when the machine has one.
#include <fmt/format.h>

#include <cmath>

#include "app/commands.h"
#include "app/run_plan.h"
#include "backend/cuda_backend.h"
#include "io/peft_adapter.h"
#include "runtime/agreed_errors.h"
#include "runtime/exit_codes.h"
#include "runtime/gpu.h"
#include "runtime/log.h"
#include "train/trainer.h"
#include "util/error.h"

namespace fsdpq {

int run_eval_command(const World& world, const std::vector<std::string>& args) {
  std::string adapter_dir;
  std::vector<std::string> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--adapter") {
      if (i + 1 >= args.size()) fail("eval: --adapter needs a directory");
      adapter_dir = args[++i];
    } else if (args[i].rfind("--adapter=", 0) == 0) {
      adapter_dir = args[i].substr(10);
    } else {
      rest.push_back(args[i]);
    }
  }
  ResolvedConfig resolved = resolve_train_arguments(world, rest);
  RunPlan plan = prepare_run(world, resolved, DataUse::Evaluation);
  const TrainConfig& c = resolved.config;
  ModelOptions options = model_options_from(c);
  options.lora_dropout = 0;
  std::vector<std::pair<std::string, Tensor>> adapter_tensors;
  if (!adapter_dir.empty()) {
    LoadedAdapter adapter = load_peft_adapter(adapter_dir);
    // The adapter's own shape wins over the config's LoRA settings.
    options.lora_rank = adapter.config.r;
    options.lora_alpha = adapter.config.lora_alpha;
    options.lora_targets = adapter.config.target_modules;
    options.use_dora = adapter.config.use_dora;
    adapter_tensors = std::move(adapter.tensors);
  } else if (c.is_lora()) {
    options.lora_targets.clear();  // untrained adapters would change nothing: evaluate the base
    options.use_dora = false;
  }
  LlamaModel model = build_model(plan, options);
  if (!adapter_tensors.empty()) model.load_adapter_tensors(adapter_tensors);
  // On a GPU when there is one, as training (CUDA_VISIBLE_DEVICES= keeps the CPU backend).
  const GpuInfo gpu = select_gpu(world);
  if (gpu.has_gpu()) {
    cuda_init(gpu.device);
    model.place_on(Device::CUDA);
  }
  const bool has_eval = !plan.dataset.eval.empty();
  const auto& examples = has_eval ? plan.dataset.eval : plan.dataset.train.tokenized_examples();
  double loss = evaluate_loss(model, examples, c.batch_size, plan.tokenizer->pad_id(), c.context_length, nullptr,
                              c.padding_free);
  log::info("{} data{}: {}", has_eval ? "held-out" : "training",
            adapter_dir.empty() ? "" : fmt::format(" with adapters {}", adapter_dir), describe_eval(loss, examples));
  return kExitOk;
}

}  // namespace fsdpq
