// `save_model = true`: at the end of training, the adapters in PEFT's layout (loadable with
// peft.PeftModel.from_pretrained) or, for train_type full and Llama-Pro, the whole model as an HF
// directory (Llama-Pro's expanded: docs/llama_pro.md says why not only the new blocks).
#pragma once
#include <string>

#include "app/run_plan.h"
#include "config/config_loader.h"
#include "model/llama_model.h"

namespace fsdpq {

// Writes into output_dir (every file atomically); returns a line saying what was written where.
std::string save_trained_model(LlamaModel& model, const ResolvedConfig& resolved, const RunPlan& plan);

}  // namespace fsdpq
