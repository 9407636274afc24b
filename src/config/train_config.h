// Every setting of a training run, typed. The option table in options.cpp gives each field its
// .ini key (fsdp_qlora's names), type, default, allowed values and documentation.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/sharding_strategy.h"
#include "model/precision.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"

namespace fsdpq {

// What trains: every weight, or LoRA adapters over a frozen base in bf16, NF4 or HQQ
// (fsdp_qlora's custom_lora / custom_qlora are lora / qlora), or DoRA adapters over NF4 (bnb_dora)
// or HQQ (hqq_dora), or Llama-Pro's new blocks over a frozen NF4 or HQQ base (bnb_llama_pro /
// hqq_llama_pro).
enum class TrainType { Full, Lora, Qlora, HqqLora, BnbDora, HqqDora, BnbLlamaPro, HqqLlamaPro };

// The choice settings, parsed once when the config is resolved (config_loader.cpp): code reads
// these; the strings in TrainConfig keep the user's spelling for logs, headers and checkpoints.
struct TrainChoices {
  TrainType train_type = TrainType::Qlora;
  Precision precision = Precision::BF16;
  OptimizerKind optimizer = OptimizerKind::adamw;
  LrScheduleKind lr_scheduler = LrScheduleKind::constant;
  ShardingStrategy sharding = ShardingStrategy::FullShard;
};

struct TrainConfig {
  // [model]
  std::string model_name;
  std::string tokenizer_path;
  std::string train_type;
  std::string precision;
  int64_t n_bits = 4;  // HQQ's width (hqq_lora, hqq_dora, hqq_llama_pro)
  int64_t llama_pro_num_new_blocks = 0;  // Llama-Pro's added decoder layers (the *_llama_pro train types)
  double loss_scale_init = 0;             // fp16_autocast only
  int64_t loss_scale_growth_interval = 0;  // fp16_autocast only
  // [lora]
  int64_t lora_rank = 0;
  double lora_alpha = 0;
  double lora_dropout = 0;
  std::vector<std::string> lora_target_modules;  // resolved: "all"/"default" expanded
  // [data]
  std::string dataset;
  std::string data_path;
  int64_t dataset_samples = 0;
  int64_t context_length = 0;
  bool pad_to_context_length = false;
  bool packing = false;  // several examples per row (docs/packing.md)
  bool padding_free = false;  // unpacked batches' examples in one row, no padding (docs/packing.md)
  bool skip_bad_records = false;
  std::string eval_data_path;
  double eval_fraction = 0;
  int64_t eval_every_steps = 0;
  // [training]
  int64_t batch_size = 0;
  int64_t gradient_accumulation_steps = 0;
  int64_t num_epochs = 0;
  int64_t max_steps = 0;
  int64_t seed = 0;
  std::string optimizer;
  double lr = 0;
  double wd = 0;
  std::string lr_scheduler;
  double min_lr_fraction = 0;
  bool apply_gradient_clipping = false;
  double grad_norm = 0;
  // [sharding]
  std::string sharding_strategy;
  bool use_gradient_checkpointing = false;
  int64_t checkpoint_every = 1;
  int64_t keep_activation_layers = 0;  // with checkpointing: the last n layers keep their activations
  bool recompute_elementwise = false;
  int64_t keep_dequantized_layers = 0;  // the last k layers keep their dense base weights for the backward
  bool use_cpu_offload = false;
  bool use_activation_cpu_offload = false;
  bool low_memory = false;
  bool no_sync = false;
  int64_t ranks_per_node = 0;
  int64_t world_size = 0;
  // [checkpoint]
  int64_t save_every_steps = 0;
  std::string checkpoint_dir;
  int64_t keep_last = 0;
  std::string resume;
  double collective_timeout_s = 600;  // the watchdog's limit on a wait on other ranks (0: none)
  bool overwrite = false;            // a fresh run may replace a previous run's files in output_dir
  bool resume_ignore_model = false;  // continue a checkpoint made from another base model or tokenizer
  // [output]
  bool save_model = false;
  std::string output_dir;
  std::string log_to;
  bool verbose = false;
  bool profile = false;
  bool profile_memory = false;
  bool dry_run = false;

  TrainChoices choice;  // the strings above, parsed

  // Adapters (LoRA or DoRA) over a frozen base.
  bool is_lora() const {
    const TrainType t = choice.train_type;
    return t == TrainType::Lora || t == TrainType::Qlora || t == TrainType::HqqLora || dora();
  }
  bool full_finetune() const { return choice.train_type == TrainType::Full; }
  bool llama_pro() const {
    return choice.train_type == TrainType::BnbLlamaPro || choice.train_type == TrainType::HqqLlamaPro;
  }
  bool dora() const { return choice.train_type == TrainType::BnbDora || choice.train_type == TrainType::HqqDora; }
  bool quantized_base() const {
    const TrainType t = choice.train_type;
    return t == TrainType::Qlora || t == TrainType::BnbDora || t == TrainType::BnbLlamaPro || hqq_base();
  }
  bool hqq_base() const {
    const TrainType t = choice.train_type;
    return t == TrainType::HqqLora || t == TrainType::HqqDora || t == TrainType::HqqLlamaPro;
  }
  bool sharded() const { return choice.sharding != ShardingStrategy::Ddp; }
  bool hybrid() const { return is_hybrid(choice.sharding); }
};

}  // namespace fsdpq
