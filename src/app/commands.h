// The subcommands of the fsdpq binary. Each returns the process exit code.
#pragma once
#include <string>
#include <vector>

#include "config/config_loader.h"
#include "runtime/world.h"

namespace fsdpq {

// `CONFIG.ini --key value ...` → the resolved config (agreed on every rank; warnings printed).
// `print_config` (optional) reports whether --print-config was given.
ResolvedConfig resolve_train_arguments(const World& world, const std::vector<std::string>& args,
                                       bool* print_config = nullptr);
// `fsdpq CONFIG.ini ...`: the training job (or its dry run).
int run_training_job(const World& world, const ResolvedConfig& config);
// `fsdpq init-model --preset NAME --out DIR`
int run_init_model_command(const World& world, const std::vector<std::string>& args);
// `fsdpq init-tokenizer --input FILE --out FILE`
int run_init_tokenizer_command(const World& world, const std::vector<std::string>& args);
// `fsdpq demo`: prepares the demo's model, tokenizer and data, then runs the embedded demo config.
int run_demo_command(const World& world, const std::vector<std::string>& args);
// `fsdpq merge --model DIR --adapter DIR --out DIR`: a LoRA adapter folded into its base model.
int run_merge_command(const World& world, const std::vector<std::string>& args);
// `fsdpq generate --model DIR [--adapter DIR] --prompt TEXT`: continues a prompt (KV-cached, sampled).
int run_generate_command(const World& world, const std::vector<std::string>& args);

// `fsdpq tokenize --tokenizer PATH --text TEXT | --jsonl FILE`: the ids a tokenizer gives.
int run_tokenize_command(const World& world, const std::vector<std::string>& args);

// `fsdpq plan CONFIG.ini [--gpus N --gpu-mem GiB --host-mem GiB]`: the memory planner.
int run_plan_command(const World& world, const std::vector<std::string>& args);

// `fsdpq eval CONFIG.ini [--adapter DIR]`: one evaluation pass.
int run_eval_command(const World& world, const std::vector<std::string>& args);

// `fsdpq examples CONFIG.ini --out FILE`: the train examples as JSON lines, in epoch 1's order.
int run_examples_command(const World& world, const std::vector<std::string>& args);

}  // namespace fsdpq
