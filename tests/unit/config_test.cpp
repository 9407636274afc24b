#include <gtest/gtest.h>

#include <filesystem>

#include "config/config_loader.h"
#include "config/ini_file.h"
#include "config/options.h"
#include "test_support.h"
#include "util/error.h"

namespace fsdpq {
namespace {

namespace fs = std::filesystem;

// Resolves `ini` (written to a temp file named cfg.ini) and returns the error text, or "" if fine.
std::string error_of(const std::string& ini, const std::vector<ConfigOverride>& overrides = {}) {
  fs::path dir = test::make_temp_dir("cfg");
  test::write_file(dir / "cfg.ini", ini);
  fs::path cwd = fs::current_path();
  fs::current_path(dir);
  std::string message;
  try {
    resolve_config(fs::path("cfg.ini"), overrides);
  } catch (const UserError& e) {
    message = e.what();
  }
  fs::current_path(cwd);
  return message;
}

ResolvedConfig resolve_in(const fs::path& dir, const std::string& ini, const std::vector<ConfigOverride>& overrides = {}) {
  test::write_file(dir / "cfg.ini", ini);
  fs::path cwd = fs::current_path();
  fs::current_path(dir);
  ResolvedConfig r;
  try {
    r = resolve_config(fs::path("cfg.ini"), overrides);
  } catch (...) {
    fs::current_path(cwd);
    throw;
  }
  fs::current_path(cwd);
  return r;
}

const char* kDummy = "dataset = dummy\n";

TEST(ConfigDefaults, MatchFsdpQloraAndAreValid) {
  ResolvedConfig r = resolve_config_text(kDummy, "t.ini", {});
  const TrainConfig& c = r.config;
  EXPECT_EQ(c.train_type, "qlora");
  EXPECT_EQ(c.precision, "bf16");
  EXPECT_EQ(c.batch_size, 1);
  EXPECT_EQ(c.context_length, 512);
  EXPECT_EQ(c.lora_rank, 64);
  EXPECT_DOUBLE_EQ(c.lora_alpha, 16);
  EXPECT_DOUBLE_EQ(c.lora_dropout, 0.1);
  EXPECT_EQ(c.lora_target_modules,
            (std::vector<std::string>{"k_proj", "q_proj", "v_proj", "up_proj", "down_proj", "gate_proj"}));
  EXPECT_DOUBLE_EQ(c.lr, 1e-5);
  EXPECT_DOUBLE_EQ(c.wd, 0.1);
  EXPECT_DOUBLE_EQ(c.grad_norm, 0.3);
  EXPECT_EQ(c.sharding_strategy, "full_shard");
  EXPECT_EQ(c.dataset_samples, 128);
  EXPECT_EQ(c.max_steps, -1);
  EXPECT_EQ(c.seed, 42);
  EXPECT_EQ(c.checkpoint_dir, "output/checkpoints");
  EXPECT_EQ(r.sources.at("batch_size").describe(), "default");
}

TEST(ConfigResolve, CommandLineWinsOverFileWhichWinsOverDefault) {
  ResolvedConfig r = resolve_config_text("[training]\nbatch_size = 4\nlr = 2e-4  # peak\n" + std::string(kDummy),
                                         "inputs/x.ini", {{"batch_size", "8"}});
  EXPECT_EQ(r.config.batch_size, 8);
  EXPECT_EQ(r.sources.at("batch_size").describe(), "command line");
  EXPECT_DOUBLE_EQ(r.config.lr, 2e-4);
  EXPECT_EQ(r.sources.at("lr").describe(), "inputs/x.ini:3");
  EXPECT_EQ(r.sources.at("seed").describe(), "default");
}

// Elementwise recompute trims the layers that keep their activations: with checkpointing on every
// layer that takes keep_activation_layers, which then passes to the model's options.
TEST(ConfigResolve, ElementwiseRecomputeWithKeptActivationLayers) {
  const ResolvedConfig r = resolve_config_text(
      "[sharding]\nuse_gradient_checkpointing = true\nrecompute_elementwise = true\nkeep_activation_layers = 3\n" +
          std::string(kDummy),
      "inputs/x.ini", {});
  EXPECT_TRUE(r.config.recompute_elementwise);
  EXPECT_EQ(r.config.keep_activation_layers, 3);
}

TEST(ConfigResolve, ARepeatedCommandLineKeyTakesItsLastValue) {
  // As argparse (fsdp_qlora's parser) and make: scripts append overrides after their defaults.
  ResolvedConfig r = resolve_config_text("batch_size = 4\n" + std::string(kDummy), "x.ini",
                                         {{"batch_size", "8"}, {"lr", "1e-4"}, {"batch_size", "2"}});
  EXPECT_EQ(r.config.batch_size, 2);
  EXPECT_EQ(r.text.at("batch_size"), "2");
  EXPECT_EQ(r.sources.at("batch_size").describe(), "command line");
  // A bad earlier value is still an error: every value given is checked.
  EXPECT_EQ(test::error_of([] { resolve_config_text(std::string(kDummy), "x.ini", {{"batch_size", "x"}, {"batch_size", "2"}}); }),
            "command line: --batch_size x: expected an integer");
}

TEST(ConfigResolve, AByteOrderMarkBeforeTheFirstLineIsAccepted) {
  ResolvedConfig r = resolve_config_text("\xEF\xBB\xBF[training]\nbatch_size = 4\n" + std::string(kDummy), "bom.ini", {});
  EXPECT_EQ(r.config.batch_size, 4);
  EXPECT_EQ(r.sources.at("batch_size").describe(), "bom.ini:2");
  // Anywhere else it is not whitespace: a key cannot start with it.
  EXPECT_EQ(test::error_of([] { resolve_config_text("batch_size = 4\n\xEF\xBB\xBFlr = 1\n", "bom.ini", {}); }),
            "bom.ini:2: '\xEF\xBB\xBFlr' is not a valid key (letters, digits and _ only)");
}

TEST(ConfigResolve, ChoicesAreParsedOnceIntoEnums) {
  ResolvedConfig r = resolve_config_text(std::string(kDummy), "x.ini",
                                         {{"train_type", "custom_qlora"}, {"precision", "FP16_autocast"},
                                          {"optimizer", "fused_adamw"}, {"lr_scheduler", "cosine"},
                                          {"sharding_strategy", "hybrid_shard_grad_op"}});
  const TrainChoices& c = r.config.choice;
  EXPECT_EQ(c.train_type, TrainType::Qlora);
  EXPECT_EQ(c.precision, Precision::FP16Autocast);
  EXPECT_EQ(c.optimizer, OptimizerKind::adamw);
  EXPECT_EQ(c.lr_scheduler, LrScheduleKind::cosine);
  EXPECT_EQ(c.sharding, ShardingStrategy::HybridShardGradOp);
  EXPECT_TRUE(r.config.hybrid());
  EXPECT_TRUE(r.config.quantized_base());
  EXPECT_EQ(r.config.optimizer, "fused_adamw") << "the spelling stays, for headers and checkpoints";
  r = resolve_config_text(std::string(kDummy), "x.ini", {{"train_type", "custom_lora"}, {"sharding_strategy", "ddp"}});
  EXPECT_EQ(r.config.choice.train_type, TrainType::Lora);
  EXPECT_TRUE(r.config.is_lora());
  EXPECT_FALSE(r.config.quantized_base());
  EXPECT_FALSE(r.config.sharded());
  r = resolve_config_text(std::string(kDummy), "x.ini", {{"train_type", "full"}});
  EXPECT_FALSE(r.config.is_lora());
  r = resolve_config_text(std::string(kDummy), "x.ini", {{"train_type", "hqq_lora"}, {"n_bits", "3"}});
  EXPECT_EQ(r.config.choice.train_type, TrainType::HqqLora);
  EXPECT_TRUE(r.config.quantized_base() && r.config.hqq_base() && r.config.is_lora());
  EXPECT_EQ(r.config.n_bits, 3);
}

TEST(ConfigResolve, LlamaProTypesTrainNewBlocksOverAQuantisedBase) {
  ResolvedConfig r = resolve_config_text(std::string(kDummy), "x.ini",
                                         {{"train_type", "bnb_llama_pro"}, {"llama_pro_num_new_blocks", "2"}});
  EXPECT_EQ(r.config.choice.train_type, TrainType::BnbLlamaPro);
  EXPECT_TRUE(r.config.llama_pro() && r.config.quantized_base());
  EXPECT_FALSE(r.config.is_lora() || r.config.hqq_base() || r.config.full_finetune());
  EXPECT_EQ(r.config.llama_pro_num_new_blocks, 2);
  r = resolve_config_text(std::string(kDummy), "x.ini",
                          {{"train_type", "hqq_llama_pro"}, {"llama_pro_num_new_blocks", "1"}, {"n_bits", "2"}});
  EXPECT_EQ(r.config.choice.train_type, TrainType::HqqLlamaPro);
  EXPECT_TRUE(r.config.llama_pro() && r.config.quantized_base() && r.config.hqq_base());
  EXPECT_FALSE(r.config.is_lora());
  EXPECT_EQ(r.config.n_bits, 2);
  // LoRA settings do nothing here: said, not ignored.
  r = resolve_config_text(std::string(kDummy), "x.ini",
                          {{"train_type", "bnb_llama_pro"}, {"llama_pro_num_new_blocks", "1"}, {"lora_rank", "8"}});
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_EQ(r.warnings[0], "lora_rank = 8 (command line) has no effect with train_type = bnb_llama_pro");
}

TEST(ConfigResolve, ListsAndAliases) {
  auto r = resolve_config_text("lora_target_modules = q_proj, o_proj\n" + std::string(kDummy), "t.ini", {});
  EXPECT_EQ(r.config.lora_target_modules, (std::vector<std::string>{"q_proj", "o_proj"}));
  r = resolve_config_text("lora_target_modules = default\n" + std::string(kDummy), "t.ini", {});
  EXPECT_EQ(r.config.lora_target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));
  r = resolve_config_text("use_cpu_offload = yes\nprecision = BF16\n" + std::string(kDummy), "t.ini", {});
  EXPECT_TRUE(r.config.use_cpu_offload);
  EXPECT_EQ(r.config.precision, "bf16");
}

TEST(ConfigResolve, QuotedValuesKeepCommentCharacters) {
  auto r = resolve_config_text("output_dir = \"runs/a #1\"\n" + std::string(kDummy), "t.ini", {});
  EXPECT_EQ(r.config.output_dir, "runs/a #1");
}

TEST(ConfigResolve, WarnsAboutSettingsWithoutEffect) {
  auto r = resolve_config_text("train_type = full\nlora_rank = 8\n" + std::string(kDummy), "t.ini", {});
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_EQ(r.warnings[0], "lora_rank = 8 (t.ini:2) has no effect with train_type = full");
}

// packing and pad_to_context_length choose the layout over padding_free (inputs/sql.ini sets it):
// padding_free goes off, with a warning that names both settings.
TEST(ConfigResolve, PackingAndFixedLengthRowsTakePrecedenceOverPaddingFree) {
  auto r = resolve_config_text("padding_free = true\n" + std::string(kDummy), "t.ini", {{"packing", "true"}});
  EXPECT_TRUE(r.config.packing);
  EXPECT_FALSE(r.config.padding_free);
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_EQ(r.warnings[0], "padding_free = true (t.ini:1) has no effect with packing = true (command line): packed "
                           "rows already lay examples end to end (batch_size counts rows)");
  r = resolve_config_text("padding_free = true\npad_to_context_length = true\n" + std::string(kDummy), "t.ini", {});
  EXPECT_FALSE(r.config.padding_free);
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_EQ(r.warnings[0], "padding_free = true (t.ini:1) has no effect with pad_to_context_length = true (t.ini:2): "
                           "every row is padded to context_length");
  r = resolve_config_text("padding_free = true\n" + std::string(kDummy), "t.ini", {});
  EXPECT_TRUE(r.config.padding_free);
  EXPECT_TRUE(r.warnings.empty());
}

TEST(ConfigPrint, ShowsEveryKeyWithItsSource) {
  auto r = resolve_config_text("batch_size = 3\n" + std::string(kDummy), "inputs/x.ini", {{"lr", "0.001"}});
  std::string text = format_resolved_config(r);
  EXPECT_NE(text.find("batch_size = 3"), std::string::npos);
  EXPECT_NE(text.find("# inputs/x.ini:1"), std::string::npos);
  EXPECT_NE(text.find("lr = 0.001"), std::string::npos);
  EXPECT_NE(text.find("# command line"), std::string::npos);
  for (const auto& spec : option_specs()) EXPECT_NE(text.find(std::string(spec.name) + " = "), std::string::npos);
  // The printed config is itself a valid config that resolves to the same values.
  auto again = resolve_config_text(text, "printed.ini", {});
  EXPECT_EQ(again.config.batch_size, 3);
  EXPECT_DOUBLE_EQ(again.config.lr, 0.001);
}

TEST(ConfigDocs, DocsConfigMdIsInSyncWithTheOptionTable) {
  fs::path doc = fs::path(FSDPQ_SOURCE_DIR) / "docs" / "config.md";
  ASSERT_TRUE(fs::exists(doc)) << "docs/config.md is missing: run ./fsdpq --help-config > docs/config.md";
  EXPECT_EQ(test::read_file(doc), config_reference_markdown())
      << "docs/config.md is stale: run ./fsdpq --help-config > docs/config.md";
}

// The catalogue of bad configs: each gives exactly this message.
struct BadConfigCase {
  const char* name;
  std::string ini;
  std::vector<ConfigOverride> overrides;
  std::string expected;
};

class ConfigErrors : public ::testing::TestWithParam<BadConfigCase> {};

TEST_P(ConfigErrors, GiveTheExactMessage) {
  const auto& c = GetParam();
  EXPECT_EQ(error_of(c.ini, c.overrides), c.expected);
}

const std::string kCwdNote = "(relative paths are resolved from the working directory ";

INSTANTIATE_TEST_SUITE_P(
    Catalogue, ConfigErrors,
    ::testing::Values(
        BadConfigCase{"UnknownKey", "batch_sise = 4\ndataset = dummy\n", {},
                      "cfg.ini:1: 'batch_sise' is not a known setting (did you mean 'batch_size'?)"},
        BadConfigCase{"UnknownKeyNoGuess", "frobnicate = 1\ndataset = dummy\n", {},
                      "cfg.ini:1: 'frobnicate' is not a known setting (fsdpq --help lists them)"},
        BadConfigCase{"BadInt", "dataset = dummy\nbatch_size = four\n", {},
                      "cfg.ini:2: batch_size = \"four\": expected an integer"},
        BadConfigCase{"BadFloat", "dataset = dummy\nlr = 1e-4x\n", {}, "cfg.ini:2: lr = \"1e-4x\": expected a number"},
        BadConfigCase{"BadBool", "dataset = dummy\nuse_cpu_offload = maybe\n", {},
                      "cfg.ini:2: use_cpu_offload = \"maybe\": expected true or false"},
        BadConfigCase{"BelowMinimum", "dataset = dummy\nbatch_size = 0\n", {},
                      "cfg.ini:2: batch_size = \"0\": must be at least 1"},
        BadConfigCase{"AboveMaximum", "dataset = dummy\nlora_dropout = 1.5\n", {},
                      "cfg.ini:2: lora_dropout = \"1.5\": must be at most 0.99"},
        BadConfigCase{"UnknownEnum", "dataset = dummy\nsharding_strategy = fullshard\n", {},
                      "cfg.ini:2: sharding_strategy = \"fullshard\": expected one of full_shard, shard_grad_op, ddp, "
                      "hybrid_full_shard, hybrid_shard_grad_op (did you mean full_shard?)"},
        BadConfigCase{"HqqDoraWidthHqqCannotPack", "dataset = dummy\ntrain_type = hqq_dora\nn_bits = 5\n", {},
                      "n_bits = 5 (cfg.ini:3): hqq_dora quantises to 1, 2, 3, 4 or 8 bits"},
        BadConfigCase{"LlamaProWithoutNewBlocks", "dataset = dummy\ntrain_type = bnb_llama_pro\n", {},
                      "llama_pro_num_new_blocks = 0 (default): train_type bnb_llama_pro adds this many new decoder "
                      "layers; set it to at least 1 (LLaMA-Pro-8B adds 8 to Llama-2-7B's 32)"},
        BadConfigCase{"LlamaProNegativeNewBlocks",
                      "dataset = dummy\ntrain_type = hqq_llama_pro\nllama_pro_num_new_blocks = -2\n", {},
                      "cfg.ini:3: llama_pro_num_new_blocks = \"-2\": must be at least 0"},
        BadConfigCase{"NewBlocksWithoutLlamaPro", "dataset = dummy\ntrain_type = qlora\nllama_pro_num_new_blocks = 4\n",
                      {},
                      "llama_pro_num_new_blocks = 4 (cfg.ini:3) contradicts train_type = qlora (cfg.ini:2): only "
                      "bnb_llama_pro and hqq_llama_pro add blocks; qlora does not"},
        BadConfigCase{"FsdpQloraLlamaProPath", "dataset = dummy\nllama_pro_path = /models/x_blk_exp-32-40\n", {},
                      "cfg.ini:2: 'llama_pro_path' is not a setting of fsdpq: fsdpq expands the model while loading "
                      "(docs/llama_pro.md): set model_name to the original model and llama_pro_num_new_blocks to M - L "
                      "for block_expansion.py's folder blk_exp-L-M"},
        BadConfigCase{"HqqLlamaProWidthHqqCannotPack",
                      "dataset = dummy\ntrain_type = hqq_llama_pro\nllama_pro_num_new_blocks = 1\nn_bits = 6\n", {},
                      "n_bits = 6 (cfg.ini:4): hqq_llama_pro quantises to 1, 2, 3, 4 or 8 bits"},
        BadConfigCase{"HqqWidthHqqCannotPack", "dataset = dummy\ntrain_type = hqq_lora\nn_bits = 5\n", {},
                      "n_bits = 5 (cfg.ini:3): hqq_lora quantises to 1, 2, 3, 4 or 8 bits"},
        BadConfigCase{"HqqWidthAboveEight", "dataset = dummy\ntrain_type = hqq_lora\n", {{"n_bits", "16"}},
                      "command line: --n_bits 16: must be at most 8"},
        BadConfigCase{"WidthWithoutHqq", "dataset = dummy\nn_bits = 2\n", {},
                      "n_bits = 2 (cfg.ini:2) contradicts train_type = qlora (default): only the hqq train types take "
                      "another width than 4; qlora does not (use train_type hqq_lora or hqq_dora, or leave n_bits at 4)"},
        BadConfigCase{"BadListItem", "dataset = dummy\nlora_target_modules = q_proj, v_prj\n", {},
                      "cfg.ini:2: lora_target_modules = \"q_proj, v_prj\": 'v_prj' is not one of all, default, q_proj, "
                      "k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj (did you mean v_proj?)"},
        BadConfigCase{"DuplicateKey", "dataset = dummy\nlr = 1\n[training]\nlr = 2\n", {},
                      "cfg.ini:4: 'lr' is set twice (first at line 2)"},
        BadConfigCase{"MalformedLine", "dataset = dummy\njust some words\n", {},
                      "cfg.ini:2: expected 'key = value', '[section]' or a comment, got 'just some words'"},
        BadConfigCase{"MalformedSection", "[training\ndataset = dummy\n", {},
                      "cfg.ini:1: malformed section header '[training': expected [name]"},
        BadConfigCase{"UnbalancedQuote", "dataset = dummy\noutput_dir = \"runs/x\n", {},
                      "cfg.ini:2: unbalanced quotes in the value of 'output_dir'"},
        BadConfigCase{"UnknownOverride", "dataset = dummy\n", {{"epochs", "2"}},
                      "command line: '--epochs' is not a known setting (did you mean '--num_epochs'?)"},
        BadConfigCase{"BadOverride", "dataset = dummy\n", {{"context_length", "1"}},
                      "command line: --context_length 1: must be at least 2"},
        BadConfigCase{"OffloadWithDdp", "dataset = dummy\nuse_cpu_offload = true\nsharding_strategy = ddp\n", {},
                      "use_cpu_offload = true (cfg.ini:2) contradicts sharding_strategy = ddp (cfg.ini:3): CPU offload "
                      "moves sharded state to the host; use full_shard, shard_grad_op or a hybrid strategy"},
        BadConfigCase{"ActivationOffloadWithoutCheckpointing",
                      "dataset = dummy\nuse_activation_cpu_offload = true\nuse_gradient_checkpointing = false\n", {},
                      "use_activation_cpu_offload = true (cfg.ini:2) contradicts use_gradient_checkpointing = false "
                      "(cfg.ini:3): activation offload moves the checkpointed layer inputs, so it needs gradient "
                      "checkpointing"},
        BadConfigCase{"CheckpointEveryWithoutCheckpointing",
                      "dataset = dummy\ncheckpoint_every = 2\nuse_gradient_checkpointing = false\n", {},
                      "checkpoint_every = 2 (cfg.ini:2) contradicts use_gradient_checkpointing = false (cfg.ini:3): it "
                      "says which layers checkpointing recomputes, so it needs use_gradient_checkpointing = true"},
        BadConfigCase{"ElementwiseRecomputeWithEveryLayerCheckpointed",
                      "dataset = dummy\nrecompute_elementwise = true\nuse_gradient_checkpointing = true\n", {},
                      "recompute_elementwise = true (cfg.ini:2) contradicts use_gradient_checkpointing = true "
                      "(cfg.ini:3): it trims the activations of the layers that keep theirs, and with checkpointing on "
                      "every layer (checkpoint_every = 1, keep_activation_layers = 0) none does: turn checkpointing "
                      "off, or set checkpoint_every above 1 or keep_activation_layers above 0"},
        BadConfigCase{"KeptActivationLayersWithoutCheckpointing",
                      "dataset = dummy\nkeep_activation_layers = 4\nuse_gradient_checkpointing = false\n", {},
                      "keep_activation_layers = 4 (cfg.ini:2) contradicts use_gradient_checkpointing = false "
                      "(cfg.ini:3): it says which layers checkpointing leaves out, so it needs "
                      "use_gradient_checkpointing = true (without checkpointing every layer keeps its activations)"},
        BadConfigCase{"KeptActivationLayersNegative", "dataset = dummy\nkeep_activation_layers = -2\n", {},
                      "cfg.ini:2: keep_activation_layers = \"-2\": must be at least 0"},
        BadConfigCase{"KeptDequantizedLayersWithoutAQuantisedBase",
                      "dataset = dummy\ntrain_type = lora\nkeep_dequantized_layers = 4\n", {},
                      "keep_dequantized_layers = 4 (cfg.ini:3) contradicts train_type = lora (cfg.ini:2): it keeps "
                      "dequantised base weights, and train_type = lora has no quantised base (qlora, hqq_lora, "
                      "bnb_dora and hqq_dora do)"},
        BadConfigCase{"KeptDequantizedLayersNegative", "dataset = dummy\nkeep_dequantized_layers = -1\n", {},
                      "cfg.ini:2: keep_dequantized_layers = \"-1\": must be at least 0"},
        BadConfigCase{"CheckpointEveryZero", "dataset = dummy\ncheckpoint_every = 0\n", {},
                      "cfg.ini:2: checkpoint_every = \"0\": must be at least 1"},
        BadConfigCase{"GeneratedDatasetWithFile", "dataset = dummy\ndata_path = cfg.ini\n", {},
                      "dataset = dummy (cfg.ini:1) contradicts data_path = cfg.ini (cfg.ini:2): dataset dummy "
                      "generates its records; remove data_path"},
        BadConfigCase{"FileDatasetWithoutFile", "dataset = sql\n", {},
                      "dataset = sql (cfg.ini:1): this dataset is read from a local file: set data_path to its JSONL "
                      "or JSON file (fsdpq downloads nothing)"},
        BadConfigCase{"EvalFileAndFraction",
                      "dataset = dummy\neval_data_path = cfg.ini\neval_fraction = 0.1\n", {},
                      "eval_data_path = cfg.ini (cfg.ini:2) contradicts eval_fraction = 0.1 (cfg.ini:3): hold out a "
                      "fraction or give an eval file, not both"},
        BadConfigCase{"EvalWithoutData", "dataset = dummy\neval_every_steps = 10\n", {},
                      "eval_every_steps = 10 (cfg.ini:2): there is no eval data: set eval_data_path or eval_fraction"},
        BadConfigCase{"MaxStepsZero", "dataset = dummy\nmax_steps = 0\n", {},
                      "max_steps = 0 (cfg.ini:2): must be -1 (no limit) or at least 1"},
        BadConfigCase{"ModelDirMissing", "dataset = dummy\nmodel_name = models/nope\n", {},
                      "model_name = models/nope (cfg.ini:2): model directory not found (use preset:NAME for a "
                      "random-initialised model, or `fsdpq init-model --preset NAME --out DIR` to write one)"},
        BadConfigCase{"WandbNotAvailable", "dataset = dummy\nlog_to = wandb\n", {},
                      "cfg.ini:2: log_to = \"wandb\": not supported: Weights & Biases needs the network; use tqdm, "
                      "stdout or file and the metrics.jsonl (supported: tqdm, stdout, file)"}),
    [](const ::testing::TestParamInfo<BadConfigCase>& info) { return std::string(info.param.name); });

TEST(ConfigErrorsFiles, MissingDataFileNamesKeyLineAndWorkingDirectory) {
  std::string e = error_of("dataset = sql\ndata_path = data/none.jsonl\n");
  EXPECT_EQ(e.rfind("data_path = data/none.jsonl (cfg.ini:2): file not found " + kCwdNote, 0), 0u) << e;
}

TEST(ConfigErrorsFiles, MissingConfigFile) {
  try {
    resolve_config(fs::path("/nonexistent/x.ini"), {});
    FAIL() << "expected an error";
  } catch (const UserError& e) {
    EXPECT_STREQ(e.what(), "config file '/nonexistent/x.ini' not found");
  }
}

TEST(ConfigErrorsFiles, ManyProblemsAreReportedTogether) {
  std::string e = error_of("dataset = dummy\nbatch_sise = 4\nlr = abc\n");
  EXPECT_EQ(e,
            "2 problems in the configuration:\n"
            "  cfg.ini:2: 'batch_sise' is not a known setting (did you mean 'batch_size'?)\n"
            "  cfg.ini:3: lr = \"abc\": expected a number");
}

TEST(ConfigInputs, ShippedBenchmarkAndDemoConfigsResolve) {
  // The configs that need only what fsdpq generates must resolve anywhere.
  fs::path cwd = fs::current_path();
  fs::current_path(FSDPQ_SOURCE_DIR);
  for (const char* name : {"inputs/dummy_7b.ini", "inputs/dummy_70b.ini"}) {
    EXPECT_NO_THROW(resolve_config(fs::path(name), {})) << name;
  }
  fs::current_path(cwd);
}

}  // namespace
}  // namespace fsdpq
