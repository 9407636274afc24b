// The training loop end to end through the fsdpq binary: the loss falls on generated and on real
// data, metrics.jsonl holds what the analysis needs, adapters are saved in PEFT's layout and
// evaluate better than the base model.
#include <gtest/gtest.h>

#include "io/peft_adapter.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "metrics_records.h"
#include "optim/lr_schedule.h"
#include "test_support.h"

namespace fsdpq {
namespace {

namespace fs = std::filesystem;
using test::of_type;
using test::read_jsonl;
using test::run_command;

double mean_loss(const std::vector<nlohmann::json>& steps, size_t begin, size_t end) {
  double sum = 0;
  for (size_t i = begin; i < end; ++i) sum += steps[i].at("loss").get<double>();
  return sum / static_cast<double>(end - begin);
}

class Train : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { dir_ = test::make_temp_dir("train"); }
  static test::CommandResult fsdpq(const std::string& args) {
    return run_command("cd '" + dir_.string() + "' && '" + FSDPQ_BINARY + "' " + args);
  }
  static fs::path dir_;
};
fs::path Train::dir_;

TEST_F(Train, DemoLossFallsAndAdaptersAreSaved) {
  auto r = fsdpq("demo --out demo");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto lines = read_jsonl(dir_ / "demo" / "output" / "metrics.jsonl");
  auto steps = of_type(lines, "step");
  ASSERT_EQ(of_type(lines, "header").size(), 1u);
  ASSERT_EQ(steps.size(), 160u) << "demo.ini: 640 examples / batch 8 × 2 epochs";
  for (const char* key : {"step", "epoch", "loss", "lr", "grad_norm", "tokens", "step_seconds", "tokens_per_second"})
    EXPECT_TRUE(steps[0].contains(key)) << key;
  double first = mean_loss(steps, 0, 5), last = mean_loss(steps, 155, 160);
  EXPECT_LT(last, 0.6 * first) << "the demo's loss must fall clearly: " << first << " → " << last;
  EXPECT_TRUE(fs::exists(dir_ / "demo" / "output" / "adapter_model.safetensors"));
  EXPECT_TRUE(fs::exists(dir_ / "demo" / "output" / "adapter_config.json"));
  EXPECT_EQ(of_type(lines, "summary").size(), 1u);
  // What analysis/ reads: memory at fsdp_qlora's checkpoints, and each step split into phases.
  std::vector<std::string> memory_at;
  for (const auto& m : of_type(lines, "memory")) {
    memory_at.push_back(m.at("at"));
    EXPECT_GT(m.at("host_peak_resident_bytes").get<double>(), 0) << m.dump();
  }
  EXPECT_EQ(memory_at, (std::vector<std::string>{"after_load", "after_first_forward", "after_first_forward_backward",
                                                 "after_first_step", "end"}));
  for (const auto& step : steps) {
    const auto& phases = step.at("phase_seconds");
    const double fb = phases.at("forward_backward"), opt = phases.at("optimizer");
    EXPECT_GT(fb, 0) << step.dump();
    EXPECT_GE(opt, 0) << step.dump();
    EXPECT_EQ(phases.at("offload_copies").get<double>(), 0) << "no GPU, nothing copied: " << step.dump();
    EXPECT_LE(fb + opt, step.at("step_seconds").get<double>() + 1e-6) << step.dump();
  }
}

TEST_F(Train, LearningRateFollowsTheSchedule) {
  auto r = fsdpq("demo --out demo_sched --dry_run");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = fsdpq("--model_name demo_sched/model --dataset alpaca --data_path demo_sched/data.jsonl --dataset_samples 64 "
            "--batch_size 4 --context_length 256 --lr 1e-3 --lr_scheduler cosine --max_steps 12 --log_to stdout "
            "--output_dir sched_out --lora_rank 4");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto steps = of_type(read_jsonl(dir_ / "sched_out" / "metrics.jsonl"), "step");
  ASSERT_EQ(steps.size(), 12u);
  // 2000 records / 4 per batch = 500 steps in the epoch: the schedule spans those, max_steps stops early.
  LrSchedule schedule(LrScheduleKind::cosine, 1e-3, num_training_steps(1, 500, 1), 0.1);
  for (size_t k = 0; k < steps.size(); ++k)
    EXPECT_DOUBLE_EQ(steps[k].at("lr").get<double>(), schedule.lr_at(static_cast<int64_t>(k))) << k;
  EXPECT_EQ(steps[0].at("lr").get<double>(), 0.0) << "fsdp_qlora's warm-up starts at lr 0";
}

// recompute_elementwise reaches the model from the config: the same losses, to the bit, as keeping
// the layers' norm outputs and SwiGLU products (the model's test checks the gradients).
TEST_F(Train, ElementwiseRecomputeTrainsTheSameLosses) {
  auto r = fsdpq("demo --out demo_recompute --dry_run");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string run = "--model_name demo_recompute/model --dataset alpaca --data_path demo_recompute/data.jsonl "
                          "--dataset_samples 32 --batch_size 4 --context_length 128 --lr 1e-3 --max_steps 4 "
                          "--log_to stdout --lora_rank 4 --lora_dropout 0.1 --use_gradient_checkpointing false";
  r = fsdpq(run + " --output_dir kept_out");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = fsdpq(run + " --output_dir recompute_out --recompute_elementwise true");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<double> kept = test::step_losses(dir_ / "kept_out"), recomputed = test::step_losses(dir_ / "recompute_out");
  ASSERT_EQ(kept.size(), 4u);
  EXPECT_EQ(recomputed, kept);
}

TEST_F(Train, Fp16AutocastSkipsOverflowingStepsAndStillLearns) {
  // A loss scale of 2^30 overflows half's range: those steps are skipped and the scale halves until
  // the gradients fit; then it doubles after every loss_scale_growth_interval clean steps
  // (torch.amp.GradScaler). The loss must still fall.
  auto r = fsdpq("demo --out demo_fp16 --dry_run");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = fsdpq("--model_name demo_fp16/model --dataset alpaca --data_path demo_fp16/data.jsonl --dataset_samples 64 "
            "--batch_size 4 --context_length 256 --lr 3e-3 --max_steps 40 --log_to stdout --output_dir fp16_out "
            "--lora_rank 16 --lora_alpha 32 --lora_dropout 0 --precision fp16_autocast --loss_scale_init 1073741824 --loss_scale_growth_interval 5");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto steps = of_type(read_jsonl(dir_ / "fp16_out" / "metrics.jsonl"), "step");
  ASSERT_EQ(steps.size(), 40u);
  EXPECT_EQ(steps[0].at("loss_scale").get<double>(), 1073741824.0);
  EXPECT_TRUE(steps[0].at("skipped").get<bool>()) << "2^30 must overflow half";
  double scale = 1073741824.0;
  int64_t clean_in_a_row = 0, skipped = 0;
  std::vector<double> clean_losses;
  for (size_t k = 0; k < steps.size(); ++k) {
    ASSERT_EQ(steps[k].at("loss_scale").get<double>(), scale) << "step " << k + 1;
    if (steps[k].at("skipped").get<bool>()) {
      EXPECT_TRUE(steps[k].at("grad_norm").is_null()) << k;
      ++skipped;
      scale /= 2;
      clean_in_a_row = 0;
    } else {
      EXPECT_TRUE(std::isfinite(steps[k].at("grad_norm").get<double>())) << k;
      clean_losses.push_back(steps[k].at("loss").get<double>());
      if (++clean_in_a_row == 5) {
        scale *= 2;
        clean_in_a_row = 0;
      }
    }
  }
  RecordProperty("skipped_steps", std::to_string(skipped));
  EXPECT_GE(skipped, 3);
  ASSERT_GE(clean_losses.size(), 20u) << skipped << " of 40 steps skipped";
  const size_t n = clean_losses.size();
  const double first = (clean_losses[0] + clean_losses[1] + clean_losses[2] + clean_losses[3] + clean_losses[4]) / 5;
  const double last = (clean_losses[n - 1] + clean_losses[n - 2] + clean_losses[n - 3] + clean_losses[n - 4] +
                       clean_losses[n - 5]) / 5;
  EXPECT_LT(last, 0.9 * first) << first << " → " << last;  // measured 7.2 → 5.0 with 13 steps skipped
  EXPECT_NE(r.output.find("grad_norm skipped (fp16 overflow)"), std::string::npos) << r.output;
}

TEST_F(Train, TqdmDrawsABarOnATerminalAndPlainLinesOtherwise) {
  // log_to = tqdm: on a terminal one line redrawn in place (\r, erase-line) with percent, bar,
  // loss, lr, throughput, elapsed<ETA; through a pipe the plain per-step lines instead.
  // `script` (util-linux) runs the command on a pseudo-terminal.
  if (std::system("command -v script > /dev/null 2>&1") != 0) GTEST_SKIP() << "SKIPPED: no `script` to make a terminal";
  auto r = fsdpq("demo --out demo_tty --dry_run");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string train = "'" + std::string(FSDPQ_BINARY) +
                            "' --model_name demo_tty/model --dataset alpaca --data_path demo_tty/data.jsonl "
                            "--dataset_samples 16 --batch_size 4 --context_length 128 --max_steps 4 --lora_rank 4 "
                            "--log_to tqdm --output_dir ";
  r = run_command("cd '" + dir_.string() + "' && script -qec \"" + train + "tty_bar\" /dev/null");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\r\033[K100% [########################] 4/4 loss "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" 1/4 loss "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" tok/s 0:0"), std::string::npos) << "elapsed<eta after the throughput: " << r.output;
  EXPECT_EQ(r.output.find("step 1/4 epoch"), std::string::npos) << "no plain lines on a terminal: " << r.output;

  r = run_command("cd '" + dir_.string() + "' && " + train + "tty_plain");  // popen's stdout is a pipe
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step 1/4 epoch 0 loss "), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("\r\033[K"), std::string::npos) << "no bar through a pipe: " << r.output;
}

TEST_F(Train, SqlLossFallsOnRealDataWithTheLlamaTokenizer) {
  FSDPQ_SHARED_DATA_OR_SKIP(sql, "sql.jsonl");
  FSDPQ_SHARED_DATA_OR_SKIP(tok, "tokenizer.model");
  auto init = fsdpq("init-model --preset tiny --out sqlmodel --initializer_range 0.2 --tokenizer " + tok.string());
  ASSERT_EQ(init.exit_code, 0) << init.output;
  auto r = fsdpq("--model_name sqlmodel --dataset sql --data_path " + sql.string() +
                 " --batch_size 8 --context_length 256 --lr 3e-3 --lora_rank 16 --lora_alpha 32 --lora_dropout 0 "
                 "--max_steps 60 --log_to stdout --output_dir sql_out --eval_fraction 0.02");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto lines = read_jsonl(dir_ / "sql_out" / "metrics.jsonl");
  auto steps = of_type(lines, "step");
  ASSERT_EQ(steps.size(), 60u);
  double first = mean_loss(steps, 0, 5), last = mean_loss(steps, 55, 60);
  EXPECT_LT(last, 0.8 * first) << first << " → " << last;
  auto evals = of_type(lines, "eval");
  ASSERT_EQ(evals.size(), 1u);
  EXPECT_TRUE(std::isfinite(evals[0].at("eval_loss").get<double>()));
}

// hqq_lora trains on sql data with falling loss, at fsdp_qlora's default width and at 2 bits.
TEST_F(Train, SqlLossFallsWithAnHqqBase) {
  FSDPQ_SHARED_DATA_OR_SKIP(sql, "sql.jsonl");
  FSDPQ_SHARED_DATA_OR_SKIP(tok, "tokenizer.model");
  auto init = fsdpq("init-model --preset tiny --out sqlmodel_hqq --initializer_range 0.2 --tokenizer " + tok.string());
  ASSERT_EQ(init.exit_code, 0) << init.output;
  for (int bits : {4, 2}) {
    const std::string out = "sql_hqq" + std::to_string(bits);
    auto r = fsdpq("--model_name sqlmodel_hqq --dataset sql --data_path " + sql.string() +
                   " --train_type hqq_lora --n_bits " + std::to_string(bits) +
                   " --batch_size 8 --context_length 256 --lr 3e-3 --lora_rank 16 --lora_alpha 32 --lora_dropout 0 "
                   "--max_steps 40 --log_to stdout --save_model true --output_dir " + out);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto steps = of_type(read_jsonl(dir_ / out / "metrics.jsonl"), "step");
    ASSERT_EQ(steps.size(), 40u);
    double first = mean_loss(steps, 0, 5), last = mean_loss(steps, 35, 40);
    EXPECT_LT(last, 0.8 * first) << bits << " bits: " << first << " → " << last;
    EXPECT_TRUE(fs::exists(dir_ / out / "adapter_model.safetensors"));
  }
}

// DoRA trains on sql data with falling loss over an NF4 base (bnb_dora, no dropout: PEFT's path
// that reuses the base output) and a 4-bit HQQ base (hqq_dora, dropout 0.1: PEFT's path that runs
// the base weight again over the dropped input); the adapters are saved with their magnitudes.
TEST_F(Train, SqlLossFallsWithDora) {
  FSDPQ_SHARED_DATA_OR_SKIP(sql, "sql.jsonl");
  FSDPQ_SHARED_DATA_OR_SKIP(tok, "tokenizer.model");
  auto init = fsdpq("init-model --preset tiny --out sqlmodel_dora --initializer_range 0.2 --tokenizer " + tok.string());
  ASSERT_EQ(init.exit_code, 0) << init.output;
  for (const std::string run : {"bnb_dora 0", "hqq_dora 0.1"}) {
    const std::string type = run.substr(0, run.find(' ')), dropout = run.substr(run.find(' ') + 1);
    const std::string out = "sql_" + type;
    auto r = fsdpq("--model_name sqlmodel_dora --dataset sql --data_path " + sql.string() + " --train_type " + type +
                   " --batch_size 8 --context_length 256 --lr 3e-3 --lora_rank 16 --lora_alpha 32 --lora_dropout " +
                   dropout + " --max_steps 40 --log_to stdout --save_model true --output_dir " + out);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto steps = of_type(read_jsonl(dir_ / out / "metrics.jsonl"), "step");
    ASSERT_EQ(steps.size(), 40u);
    double first = mean_loss(steps, 0, 5), last = mean_loss(steps, 35, 40);
    EXPECT_LT(last, 0.8 * first) << type << ": " << first << " → " << last;
    const LoadedAdapter adapter = load_peft_adapter(dir_ / out);
    EXPECT_TRUE(adapter.config.use_dora) << type;
    EXPECT_TRUE(adapter.find("base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector")) << type;
  }
}

// A Llama-3-shaped model with the real Llama-3 tokenizer (tokenizer.json, 128,256 ids) as
// init-model writes it: a complete HF folder (tokenizer files copied, config.json naming its
// special tokens); the dry run names the tokenizer; it trains on sql data on the CPU with falling
// loss, and generate runs on it.
TEST_F(Train, ALlama3FolderWithItsTokenizerJsonTrainsAndGenerates) {
  FSDPQ_SHARED_DATA_OR_SKIP(sql, "sql.jsonl");
  FSDPQ_SHARED_DATA_OR_SKIP(tokenizer_json, "llama3/tokenizer.json");
  auto r = fsdpq("init-model --preset tiny --vocab_size 128256 --out llama3_tiny --initializer_range 0.2 --tokenizer " +
                 tokenizer_json.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* file : {"tokenizer.json", "tokenizer_config.json", "config.json", "model.safetensors"})
    EXPECT_TRUE(fs::exists(dir_ / "llama3_tiny" / file)) << file;
  EXPECT_EQ(test::read_file(dir_ / "llama3_tiny" / "tokenizer.json"), test::read_file(tokenizer_json));
  const auto config = nlohmann::json::parse(test::read_file(dir_ / "llama3_tiny" / "config.json"));
  EXPECT_EQ(config.at("bos_token_id"), 128000);
  EXPECT_EQ(config.at("eos_token_id"), 128001);

  const std::string run = "--model_name llama3_tiny --dataset sql --data_path " + sql.string() +
                          " --batch_size 8 --context_length 256 --lr 3e-3 --lora_rank 16 --lora_alpha 32 "
                          "--lora_dropout 0 --max_steps 40 --log_to stdout --save_model true --output_dir llama3_out";
  r = fsdpq(run + " --dry_run true");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tokenizer: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("llama3_tiny/tokenizer.json"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(bos 128000, eos 128001, pad 128001)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("records: 4000 read"), std::string::npos) << r.output;

  r = fsdpq(run);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto steps = of_type(read_jsonl(dir_ / "llama3_out" / "metrics.jsonl"), "step");
  ASSERT_EQ(steps.size(), 40u);
  EXPECT_LT(mean_loss(steps, 35, 40), 0.8 * mean_loss(steps, 0, 5));

  r = fsdpq("generate --model llama3_tiny --adapter llama3_out --prompt 'SELECT name FROM' --max_new_tokens 8");
  EXPECT_EQ(r.exit_code, 0) << r.output;

  // A fully fine-tuned model is saved with the tokenizer it trained with, so the folder loads alone.
  r = fsdpq("--model_name llama3_tiny --dataset sql --data_path " + sql.string() +
            " --batch_size 2 --context_length 128 --train_type full --max_steps 2 --log_to stdout --save_model true "
            "--output_dir llama3_full");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"})
    EXPECT_EQ(test::read_file(dir_ / "llama3_full" / file), test::read_file(dir_ / "llama3_tiny" / file)) << file;
  EXPECT_FALSE(fs::exists(dir_ / "llama3_full" / "tokenizer.model")) << "the folder's tokenizer is its tokenizer.json";
  r = fsdpq("generate --model llama3_full --prompt 'SELECT name FROM' --max_new_tokens 2");
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// Tied embeddings (Llama-3.2 1B / 3B: no lm_head.weight, the head is the embedding): a model
// written so loads, trains LoRA adapters that merge into it, and trains fully, its saved model
// again without a head of its own.
TEST_F(Train, TiedEmbeddingsLoadTrainSaveAndMerge) {
  auto r = fsdpq("init-model --preset tiny --tie_word_embeddings true --vocab_size 512 --out tied --initializer_range 0.2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(nlohmann::json::parse(test::read_file(dir_ / "tied" / "config.json")).at("tie_word_embeddings"), true);
  EXPECT_EQ(test::read_file(dir_ / "tied" / "model.safetensors").find("lm_head"), std::string::npos);
  const std::string common = "--model_name tied --tokenizer_path builtin:bytes --dataset dummy --dataset_samples 32 "
                             "--context_length 256 --batch_size 2 --lr 3e-3 --max_steps 12 --log_to stdout --save_model true";
  r = fsdpq(common + " --train_type lora --lora_rank 8 --lora_alpha 16 --output_dir tied_lora");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto steps = of_type(read_jsonl(dir_ / "tied_lora" / "metrics.jsonl"), "step");
  EXPECT_LT(mean_loss(steps, 9, 12), mean_loss(steps, 0, 3));
  r = fsdpq("merge --model tied --adapter tied_lora --out tied_merged");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(test::read_file(dir_ / "tied_merged" / "model.safetensors").find("lm_head"), std::string::npos);
  r = fsdpq("generate --model tied_merged --tokenizer builtin:bytes --prompt 'hello' --max_new_tokens 4");
  EXPECT_EQ(r.exit_code, 0) << r.output;

  r = fsdpq(common + " --train_type full --precision fp32 --lr 1e-3 --output_dir tied_full");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  steps = of_type(read_jsonl(dir_ / "tied_full" / "metrics.jsonl"), "step");
  EXPECT_LT(mean_loss(steps, 9, 12), mean_loss(steps, 0, 3));
  const std::string saved = test::read_file(dir_ / "tied_full" / "model.safetensors");
  EXPECT_EQ(saved.find("lm_head"), std::string::npos) << "a tied model is saved without a head of its own";
  EXPECT_NE(saved.find("model.embed_tokens.weight"), std::string::npos);
}

TEST_F(Train, EvalCommandScoresTrainedAdaptersBetterThanTheBase) {
  auto r = fsdpq("demo --out demo_eval");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string common = "--model_name demo_eval/model --dataset alpaca_sample --data_path demo_eval/data.jsonl "
                             "--dataset_samples 128 --context_length 256 --batch_size 8 --lora_rank 16 --lora_alpha 32";
  auto base = fsdpq("eval " + common);
  ASSERT_EQ(base.exit_code, 0) << base.output;
  auto tuned = fsdpq("eval " + common + " --adapter demo_eval/output");
  ASSERT_EQ(tuned.exit_code, 0) << tuned.output;
  auto loss_of = [](const std::string& out) {
    auto pos = out.find("loss ");
    return pos == std::string::npos ? NAN : std::stod(out.substr(pos + 5));
  };
  EXPECT_LT(loss_of(tuned.output), loss_of(base.output)) << base.output << tuned.output;
}

// Records whose answers are truncated away leave nothing for the loss: a step made only of them
// logs no loss (null, target_tokens 0) instead of 0, the others' mean leaves them out, the load
// warns with their count, and eval over only such examples reports no loss.
TEST_F(Train, StepsAndEvalWithoutTargetTokensLogNoLoss) {
  const std::string long_instruction(400, 'x');
  std::string data, eval;
  for (int i = 0; i < 4; ++i) {
    data += R"({"instruction": "say hi", "input": "", "output": "hi there"})" "\n";
    data += R"({"instruction": ")" + long_instruction + R"(", "input": "", "output": "cut away"})" "\n";
    eval += R"({"instruction": ")" + long_instruction + R"(", "input": "", "output": "cut away"})" "\n";
  }
  test::write_file(dir_ / "half_cut.jsonl", data);
  test::write_file(dir_ / "all_cut.jsonl", eval);
  auto r = fsdpq("--model_name preset:tiny --tokenizer_path builtin:bytes --dataset alpaca --data_path half_cut.jsonl "
                 "--eval_data_path all_cut.jsonl --context_length 256 --batch_size 1 --max_steps 8 --train_type lora "
                 "--log_to stdout --output_dir half_cut");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("warning: 4 of 8 training examples keep no answer token after truncation to "
                          "context_length = 256 (command line)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("eval: no loss, no eval example keeps a target token after truncation (4 of 4"),
            std::string::npos)
      << r.output;
  const auto lines = read_jsonl(dir_ / "half_cut" / "metrics.jsonl");
  int empty_steps = 0;
  for (const auto& step : of_type(lines, "step")) {
    if (step.at("target_tokens") == 0) {
      ++empty_steps;
      EXPECT_TRUE(step.at("loss").is_null()) << step;
    } else {
      EXPECT_GT(step.at("loss").get<double>(), 0.0) << step;
    }
  }
  EXPECT_EQ(empty_steps, 4) << "batch size 1: one step per example";
  ASSERT_EQ(of_type(lines, "eval").size(), 1u);
  EXPECT_TRUE(of_type(lines, "eval")[0].at("eval_loss").is_null());
}

// use_cpu_offload runs the offload engine's paths on the CPU backend too: each layer's frozen
// bytes copied in from their host buffer before use and freed after, gradients accumulated on
// the worker thread, and each unit stepped there during the last micro-batch's backward, or
// after backward when clipping or fp16 loss scaling needs every gradient first. None of it may
// change a bit of the training: the same losses, gradient norms (to the last digits: the
// worker sums squares unit by unit) and saved weights as without offload. With clipping or fp16
// loss scaling the worker unscales and measures each unit during the last backward and the
// updates run during the next forward, each unit's just before it is used.
TEST_F(Train, CpuOffloadTrainsBitIdentically) {
  const std::string common = "--model_name preset:tiny --tokenizer_path builtin:bytes --dataset dummy "
                             "--dataset_samples 48 --batch_size 2 --context_length 256 --max_steps 5 --lora_rank 8 "
                             "--lr 1e-3 --save_model true --log_to stdout";
  struct Case {
    std::string name, flags, saved;
  };
  // One micro-batch per step: the update reads the gradient where it was copied out (no
  // accumulation into the shard's gradient), during backward or, with clipping, the next forward.
  for (const Case& c : {Case{"qlora", "--train_type qlora", "adapter_model.safetensors"},
                        Case{"lora_clip", "--train_type lora --apply_gradient_clipping true --grad_norm 0.1",
                             "adapter_model.safetensors"},
                        Case{"qlora_gas2", "--train_type qlora --gradient_accumulation_steps 2", "adapter_model.safetensors"},
                        Case{"lora_clip_gas2_cosine",
                             "--train_type lora --apply_gradient_clipping true --grad_norm 0.1 "
                             "--gradient_accumulation_steps 2 --lr_scheduler cosine",
                             "adapter_model.safetensors"},
                        // 2^24 overflows half here: two steps are skipped, then 2^22 fits.
                        Case{"full_fp16_skips", "--train_type full --precision fp16_autocast --loss_scale_init 16777216",
                             "model.safetensors"}}) {
    std::vector<std::vector<nlohmann::json>> runs;
    for (const char* offload : {"false", "true"}) {
      const std::string out = "offload_" + c.name + "_" + offload;
      auto r = fsdpq(common + " " + c.flags + " --use_cpu_offload " + offload + " --output_dir " + out);
      ASSERT_EQ(r.exit_code, 0) << c.name << " " << offload << "\n" << r.output;
      runs.push_back(of_type(read_jsonl(dir_ / out / "metrics.jsonl"), "step"));
    }
    ASSERT_EQ(runs[0].size(), 5u) << c.name;
    ASSERT_EQ(runs[1].size(), 5u) << c.name;
    for (size_t k = 0; k < 5; ++k) {
      EXPECT_EQ(runs[1][k].at("loss").get<double>(), runs[0][k].at("loss").get<double>()) << c.name << " step " << k;
      if (runs[0][k].at("grad_norm").is_number())
        EXPECT_NEAR(runs[1][k].at("grad_norm").get<double>(), runs[0][k].at("grad_norm").get<double>(),
                    1e-12 * runs[0][k].at("grad_norm").get<double>())
            << c.name << " step " << k;
    }
    EXPECT_GT(runs[1].back().at("phase_seconds").at("host_optimizer_overlapped").get<double>(), 0.0) << c.name;
    if (c.name == "full_fp16_skips") {
      EXPECT_TRUE(runs[1][0].at("skipped").get<bool>());
      EXPECT_FALSE(runs[1][4].at("skipped").get<bool>()) << "the scale never fitted: the test needs a lower start";
    }
    EXPECT_EQ(test::read_file(dir_ / ("offload_" + c.name + "_true") / c.saved),
              test::read_file(dir_ / ("offload_" + c.name + "_false") / c.saved))
        << c.name << ": the saved weights differ";
  }
}

// A run tokenizes only the train examples its steps read and trains exactly as with all of them
// tokenized: a 3-step run against the first 3 steps of a whole epoch (which tokenizes every
// example; the learning-rate schedule does not depend on max_steps), on 1 and 2 ranks.
TEST_F(Train, AShortRunTokenizesOnlyWhatItReadsAndTrainsTheSame) {
  const std::string common = "--model_name preset:tiny --tokenizer_path builtin:bytes --dataset synthetic "
                             "--dataset_samples 64 --batch_size 2 --gradient_accumulation_steps 2 --context_length 512 "
                             "--lora_rank 4 --lr 1e-3 --log_to stdout";
  for (int ranks : {1, 2}) {
    SCOPED_TRACE(std::to_string(ranks) + " rank(s)");
    std::vector<std::vector<nlohmann::json>> steps;
    std::vector<nlohmann::json> headers;
    for (const std::string max_steps : {"-1", "3"}) {
      const std::string out = "chosen_np" + std::to_string(ranks) + "_max" + max_steps;
      auto r = run_command("cd '" + dir_.string() + "' && " + MPIEXEC + " --allow-run-as-root --oversubscribe -np " +
                           std::to_string(ranks) + " '" + FSDPQ_BINARY + "' " + common + " --max_steps " + max_steps +
                           " --output_dir " + out + " 2>&1");
      ASSERT_EQ(r.exit_code, 0) << r.output;
      const auto lines = read_jsonl(dir_ / out / "metrics.jsonl");
      steps.push_back(of_type(lines, "step"));
      headers.push_back(of_type(lines, "header").at(0));
    }
    const int64_t global_batch = 2 * 2 * ranks;
    ASSERT_EQ(steps[0].size(), static_cast<size_t>(64 / global_batch));
    ASSERT_EQ(steps[1].size(), 3u);
    for (size_t k = 0; k < 3; ++k)
      EXPECT_EQ(steps[1][k].at("loss").get<double>(), steps[0][k].at("loss").get<double>()) << "step " << k + 1;
    EXPECT_EQ(headers[0].at("dataset").at("train_examples_tokenized"), 64);
    EXPECT_EQ(headers[1].at("dataset").at("train_examples"), 64);
    EXPECT_EQ(headers[1].at("dataset").at("train_examples_tokenized"), 3 * global_batch);
  }
}

// A million dummy examples and two steps: the run makes and tokenizes the 4 it reads.
TEST_F(Train, AMillionExamplesAndTwoStepsTokenizeFour) {
  auto r = fsdpq("--model_name preset:tiny --tokenizer_path builtin:bytes --dataset dummy --dataset_samples 1000000 "
                 "--batch_size 2 --max_steps 2 --context_length 256 --lora_rank 4 --log_to stdout --output_dir million");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tokenized 4 of the 1000000 train examples: those the run's 2 step(s) read"),
            std::string::npos)
      << r.output;
  const auto lines = read_jsonl(dir_ / "million" / "metrics.jsonl");
  const auto header = of_type(lines, "header").at(0);
  EXPECT_EQ(header.at("dataset").at("train_examples"), 1000000);
  EXPECT_EQ(header.at("dataset").at("train_examples_tokenized"), 4);
  EXPECT_EQ(of_type(lines, "step").size(), 2u);
}

}  // namespace
}  // namespace fsdpq
