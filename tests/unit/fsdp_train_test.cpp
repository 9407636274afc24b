// Sharded training through the real binary under mpirun (CPU ranks, the MPI transport).
//
// Equivalence: the same global batch of 4 examples per step as 1 rank × 4 accumulated
// micro-batches, 2 ranks × 2 and 4 ranks × 1, one example per micro-batch. fsdp_qlora's loss is
// each micro-batch's token mean / accumulation steps, averaged over ranks, so all three optimise
// exactly the same objective on the same samples (DistributedSampler hands rank r the samples
// r, r + W, ...); they differ only in the order in which fp32 gradients are summed. Tolerances
// (the measured differences, 2026-12-03): losses within 1e-5 relative (bf16: 0, fp32: 3e-8);
// saved weights within 2 bf16 ulps of the tensor's scale for bf16 runs (measured: identical) and
// 3e-5 for fp32 adapters (measured 3.4e-6: AdamW's normalisation amplifies summation-order noise).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "io/model_files.h"
#include "io/safetensors.h"
#include "metrics_records.h"
#include "test_support.h"
#include "util/bf16.h"

namespace fsdpq {
namespace {

namespace fs = std::filesystem;
using test::of_type;
using test::read_jsonl;
using test::run_command;
using test::step_losses;

using Weights = std::map<std::string, std::vector<float>>;

std::vector<float> to_floats(const TensorInfo& info, std::span<const std::byte> bytes) {
  std::vector<float> v(static_cast<size_t>(info.numel()));
  for (size_t i = 0; i < v.size(); ++i) {
    if (info.dtype == DType::F32) {
      std::memcpy(&v[i], bytes.data() + 4 * i, 4);
    } else {
      uint16_t b;
      std::memcpy(&b, bytes.data() + 2 * i, 2);
      v[i] = bf16_to_float(b);
    }
  }
  return v;
}

// The trained tensors a run saved: PEFT adapters, or the whole HF model for full fine-tuning.
Weights saved_weights(const fs::path& out) {
  Weights w;
  if (fs::exists(out / "adapter_model.safetensors")) {
    auto file = SafetensorsFile::open(out / "adapter_model.safetensors");
    for (const auto& t : file.tensors()) w[t.name] = to_floats(t, file.bytes(t));
  } else {
    auto model = ModelWeights::open(out);
    for (const auto& name : model.tensor_names()) w[name] = to_floats(*model.find(name), model.bytes(name));
  }
  return w;
}

// Largest |a - b| relative to the tensor's largest |value|, over all tensors.
double max_relative_difference(const Weights& a, const Weights& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (const auto& [name, x] : a) {
    auto it = b.find(name);
    if (it == b.end()) {
      ADD_FAILURE() << "missing " << name;
      continue;
    }
    const auto& y = it->second;
    EXPECT_EQ(x.size(), y.size()) << name;
    double scale = 1e-30, diff = 0;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      scale = std::max(scale, std::fabs(static_cast<double>(x[i])));
      diff = std::max(diff, std::fabs(static_cast<double>(x[i]) - y[i]));
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

class FsdpTrain : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = test::make_temp_dir("fsdp_train");
    auto r = run_command("cd '" + dir_.string() + "' && '" + FSDPQ_BINARY + "' demo --out demo --dry_run");
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }

  // A short run: 4 examples per optimizer step whatever the rank count.
  // `train_type` may carry a precision: "lora:fp32".
  static std::string args(std::string train_type, int ranks, const std::string& out, int max_steps = 6) {
    std::string precision = "bf16";
    if (auto colon = train_type.find(':'); colon != std::string::npos) {
      precision = train_type.substr(colon + 1);
      train_type.resize(colon);
    }
    // Llama-Pro on the demo's 2 layers: a new block after each.
    const std::string new_blocks = train_type.find("_llama_pro") != std::string::npos ? " --llama_pro_num_new_blocks 2" : "";
    return "--precision " + precision + new_blocks + " --model_name demo/model --dataset alpaca --data_path demo/data.jsonl --dataset_samples 48 "
           "--context_length 96 --batch_size 1 --gradient_accumulation_steps " + std::to_string(4 / ranks) +
           " --train_type " + train_type + " --lora_rank 4 --lora_alpha 8 --lora_dropout 0 --lr 2e-3 "
           "--max_steps " + std::to_string(max_steps) + " --log_to stdout --save_model true --output_dir " + out;
  }

  static test::CommandResult mpirun(int ranks, const std::string& arguments, const std::string& env = "") {
    return run_command("cd '" + dir_.string() + "' && " + env + " timeout 600 " + MPIEXEC +
                       " --allow-run-as-root --oversubscribe -np " + std::to_string(ranks) + " '" + FSDPQ_BINARY +
                       "' " + arguments + " 2>&1");
  }

  static fs::path dir_;
};
fs::path FsdpTrain::dir_;

struct Case {
  std::string train_type;
  std::string strategy;
};

class Equivalence : public FsdpTrain, public ::testing::WithParamInterface<std::string> {};

// One train type, every strategy at 2 and 4 ranks, against the single-rank run.
TEST_P(Equivalence, SameLossesAndWeightsAtOneTwoAndFourRanks) {
  const std::string type = GetParam();
  const bool fp32 = type.find(":fp32") != std::string::npos;
  const std::string tag = fp32 ? type.substr(0, type.find(':')) + "_fp32" : type;
  const std::string base = "eq_" + tag + "_np1";
  auto r = mpirun(1, args(type, 1, base));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<double> want = step_losses(dir_ / base);
  ASSERT_EQ(want.size(), 6u) << r.output;
  const Weights want_weights = saved_weights(dir_ / base);
  ASSERT_FALSE(want_weights.empty());

  for (const char* strategy : {"full_shard", "shard_grad_op", "ddp", "hybrid_full_shard", "hybrid_shard_grad_op"})
    for (int ranks : {2, 4}) {
      SCOPED_TRACE(std::string(strategy) + " on " + std::to_string(ranks) + " ranks");
      const std::string out = "eq_" + tag + "_" + strategy + "_np" + std::to_string(ranks);
      std::string extra = std::string(" --sharding_strategy ") + strategy;
      if (std::string(strategy).rfind("hybrid", 0) == 0) extra += " --ranks_per_node " + std::to_string(ranks / 2);
      if (ranks == 2 && std::string(strategy) == "full_shard") extra += " --no_sync true";
      // CPU offload where ranks hold whole units but replicate them (hybrid over nodes of one
      // rank: the frozen weights are offloaded, the gradients all-reduced before any update) and
      // where they shard them.
      if (ranks == 2 && std::string(strategy) == "hybrid_full_shard") extra += " --use_cpu_offload true";
      if (ranks == 4 && std::string(strategy) == "full_shard") extra += " --use_cpu_offload true";
      r = mpirun(ranks, args(type, ranks, out) + extra);
      ASSERT_EQ(r.exit_code, 0) << r.output;
      const std::vector<double> got = step_losses(dir_ / out);
      ASSERT_EQ(got.size(), want.size());
      for (size_t k = 0; k < got.size(); ++k) EXPECT_NEAR(got[k], want[k], 1e-5 * std::fabs(want[k])) << "step " << k + 1;
      const double weight_difference = max_relative_difference(saved_weights(dir_ / out), want_weights);
      // bf16: within 2 bf16 ulps; fp32 masters: within 1e-5 of the tensor's scale.
      EXPECT_LE(weight_difference, fp32 ? 3e-5 : 2.0 / 128.0);
      double loss_difference = 0;
      for (size_t k = 0; k < got.size(); ++k) loss_difference = std::max(loss_difference, std::fabs(got[k] / want[k] - 1));
      std::printf("%s %s np%d: max relative difference: losses %.2e, weights %.2e\n", type.c_str(), strategy, ranks,
                  loss_difference, weight_difference);

      // Under full sharding each rank holds ~1/W of the parameters (padding aside).
      if (std::string(strategy) == "full_shard") {
        for (const auto& step : of_type(read_jsonl(dir_ / out / "metrics.jsonl"), "step")) {
          EXPECT_GT(step.at("gather_wait_seconds").get<double>(), 0.0) << "full_shard gathers every unit";
          EXPECT_GT(step.at("reduce_seconds").get<double>(), 0.0);
        }
        auto header = of_type(read_jsonl(dir_ / out / "metrics.jsonl"), "header").at(0);
        const auto& b = header.at("shard_bytes");
        const double frozen = b.at("frozen"), trainable = b.at("trainable");
        const double model_frozen = b.at("model_frozen"), model_trainable = b.at("model_trainable");
        EXPECT_NEAR(frozen, model_frozen / ranks, 0.01 * model_frozen / ranks + 64 * 3);
        EXPECT_NEAR(trainable, model_trainable / ranks, 0.01 * model_trainable / ranks + 64 * 3);
        // Each rank read about its share of the model file (tests/mpi/shard_load_tests.h checks it
        // closely). Not under HQQ, whose zero points read the groups their rank's codes do not
        // cover (docs/hqq.md), nor DoRA, where the rank holding a magnitude vector reads its whole
        // weight (docs/dora.md), nor Llama-Pro, whose new blocks read the layers they copy once more.
        if (type.rfind("hqq", 0) == 0 || type.find("dora") != std::string::npos ||
            type.find("_llama_pro") != std::string::npos)
          continue;
        const double file_bytes = static_cast<double>(fs::file_size(dir_ / "demo/model/model.safetensors"));
        const auto& read = header.at("load_read_bytes_per_rank");
        ASSERT_EQ(read.size(), static_cast<size_t>(ranks));
        for (const auto& bytes : read) EXPECT_NEAR(bytes.get<double>(), file_bytes / ranks, 0.1 * file_bytes / ranks);
      }
    }
}

INSTANTIATE_TEST_SUITE_P(TrainTypes, Equivalence, ::testing::Values("lora", "qlora", "full", "lora:fp32", "hqq_lora",
                                                                   "bnb_dora", "bnb_llama_pro", "hqq_llama_pro"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), ':', '_');
                           return name;
                         });


// keep_dequantized_layers under sharding: the kept layers' dense weights outlive their unit's
// frozen bytes (full_shard lets them go after the forward; CPU offload moves them), and the
// backward reads those instead of the bytes it gathers again: the same losses, bit for bit, as
// dequantising in every pass, on NF4 and HQQ bases (the demo's 2 layers: one kept, one shared).
TEST_F(FsdpTrain, KeptDequantizedLayersGiveTheSameLossesUnderSharding) {
  for (const char* type : {"qlora", "hqq_lora"})
    for (const char* extra : {" --sharding_strategy full_shard", " --sharding_strategy full_shard --use_cpu_offload true"}) {
      SCOPED_TRACE(std::string(type) + extra);
      const std::string tag = std::string("keep_") + type + (std::string(extra).find("offload") != std::string::npos ? "_offload" : "");
      auto r = mpirun(2, args(type, 2, tag + "_0", 3) + extra);
      ASSERT_EQ(r.exit_code, 0) << r.output;
      r = mpirun(2, args(type, 2, tag + "_1", 3) + extra + " --keep_dequantized_layers 1");
      ASSERT_EQ(r.exit_code, 0) << r.output;
      const std::vector<double> plain = step_losses(dir_ / (tag + "_0")), kept = step_losses(dir_ / (tag + "_1"));
      ASSERT_EQ(plain.size(), 3u);
      EXPECT_EQ(kept, plain);
    }
}

// Sharded loading: each rank reads and builds only its shard of each unit, and the mapped file
// pages leave its resident set, so the peak per rank falls with the rank count. A 1.1B-parameter
// QLoRA model (measured 2026-12-03: peak resident per rank 637 MiB on 1 rank, 363 on 2, 218 on 4;
// whole NF4 model 479 MiB; docs/sharding.md). The run stops right after loading.
TEST_F(FsdpTrain, PeakHostMemoryPerRankFallsWithTheRankCount) {
  auto r = run_command("cd '" + dir_.string() + "' && '" + FSDPQ_BINARY +
                       "' init-model --preset tinyllama-1.1b --vocab_size 260 --out big --overwrite");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto peak_mib = [&](int ranks) {
    auto run = mpirun(ranks, "--model_name big --tokenizer_path builtin:bytes --dataset dummy --dataset_samples 8 "
                             "--context_length 512 --train_type qlora --lora_rank 8 --output_dir big_out",
                      "FSDPQ_INJECT_FAULT=0:after_load");
    EXPECT_NE(run.output.find("injected fault at after_load"), std::string::npos) << run.output;
    const auto at = run.output.find("peak resident ");
    EXPECT_NE(at, std::string::npos) << run.output;
    if (at == std::string::npos) return 0.0;
    const double value = std::stod(run.output.substr(at + 14));
    const bool gib = run.output.compare(at + 14 + run.output.substr(at + 14).find(' ') + 1, 3, "GiB") == 0;
    return gib ? value * 1024 : value;
  };
  const double one = peak_mib(1), four = peak_mib(4);
  EXPECT_GT(one, 479.0) << "one rank holds the whole NF4 model";
  EXPECT_LT(four, 0.5 * one) << "4 ranks: " << four << " MiB vs 1 rank: " << one << " MiB";
  EXPECT_LT(four, 479.0) << "no rank of 4 holds as much as the whole model";
  fs::remove_all(dir_ / "big");
}

// A failure while one rank reads its shard of a unit ends every rank with that rank's message
// (each unit's reading is agreed before its collective), promptly, with no rank left waiting.
TEST_F(FsdpTrain, AFailureOnOneRankWhileLoadingAUnitEndsEveryRankWithItsMessage) {
  const auto start = std::chrono::steady_clock::now();
  auto r = mpirun(2, args("qlora", 2, "load_fail"), "FSDPQ_INJECT_FAULT=1:load_unit_2");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("injected fault at load_unit_2"), std::string::npos) << r.output;
  EXPECT_LT(seconds, 60.0);
}

// ---- Checkpoints and resume --------------------------------------------------------------------

// Per step, the loss the metrics last logged for it (a resumed run appends: steps after the
// checkpoint it resumed from appear twice, the resumed run's last).
std::map<int64_t, double> losses_by_step(const fs::path& out) {
  std::map<int64_t, double> l;
  for (const auto& s : of_type(read_jsonl(out / "metrics.jsonl"), "step")) l[s.at("step").get<int64_t>()] = s.at("loss").get<double>();
  return l;
}

// 8 steps' losses and the saved weights of the run in `got_dir` against `want_dir`'s: bit for bit,
// or within the tolerances of another summation order (another world size).
void expect_same_losses(const fs::path& got_dir, const fs::path& want_dir, bool bit_identical) {
  const auto want = losses_by_step(want_dir), got = losses_by_step(got_dir);
  ASSERT_EQ(want.size(), 8u);
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [step, loss] : want) {
    if (bit_identical)
      EXPECT_EQ(got.at(step), loss) << "step " << step;
    else
      EXPECT_NEAR(got.at(step), loss, 1e-5 * loss) << "step " << step;
  }
  const double d = max_relative_difference(saved_weights(got_dir), saved_weights(want_dir));
  EXPECT_LE(d, bit_identical ? 0.0 : 2.0 / 128.0);
}

class Checkpoints : public FsdpTrain {
 protected:
  // 8 steps of 4 examples, a checkpoint every 2 steps.
  // `overrides` ("--key value ...") replace the same keys of the standard run.
  static std::string run_args(int ranks, const std::string& out, const std::string& overrides = "", int max_steps = 8) {
    return merge_options(args("lora", ranks, out, max_steps) + " --save_every_steps 2 --keep_last 3", overrides);
  }
  static std::string merge_options(const std::string& base, const std::string& overrides) {
    std::vector<std::pair<std::string, std::string>> options;
    auto add = [&](const std::string& text) {
      std::istringstream in(text);
      std::string key, value;
      while (in >> key >> value) {
        auto it = std::find_if(options.begin(), options.end(), [&](const auto& o) { return o.first == key; });
        if (it != options.end())
          it->second = value;
        else
          options.emplace_back(key, value);
      }
    };
    add(base);
    add(overrides);
    std::string out;
    for (const auto& [key, value] : options) out += " " + key + " " + value;
    return out;
  }
  // The uninterrupted 2-rank run the interrupted ones are compared with.
  static void SetUpTestSuite() {
    FsdpTrain::SetUpTestSuite();
    auto r = mpirun(2, run_args(2, "ck_ref"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  // `out`'s losses at every step and its saved weights against `reference`'s: bit for bit, or within
  // the tolerances of another summation order (another world size).
  static void expect_same_as_reference(const std::string& out, bool bit_identical,
                                       const std::string& reference = "ck_ref") {
    expect_same_losses(dir_ / out, dir_ / reference, bit_identical);
  }
  // A 2-rank run of `overrides` killed (SIGKILL on rank 1) after step 5, which leaves the step-4
  // checkpoint the latest, then resumed on `resume_ranks` ranks; `resumed` gets that run's result.
  static void kill_after_step_5_and_resume(const std::string& out, const std::string& overrides, int resume_ranks,
                                           test::CommandResult& resumed) {
    auto r = mpirun(2, run_args(2, out, overrides), "FSDPQ_INJECT_FAULT=1:after_step_5:kill");
    ASSERT_NE(r.exit_code, 0) << r.output;
    EXPECT_EQ(test::read_file(dir_ / out / "checkpoints" / "latest"), "step-00000004.h5\n");
    resumed = mpirun(resume_ranks, run_args(resume_ranks, out, overrides + " --resume auto"));
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  }
  // A train type's run resumes bit-identically: the uninterrupted 2-rank run `NAME_ref`, then for
  // each of `resume_ranks` a run killed after step 5 and resumed on that many ranks (`NAME_kill_npR`),
  // with the reference's losses and saved weights.
  static void expect_resumes_bit_identically(const std::string& name, const std::string& overrides,
                                             const std::vector<int>& resume_ranks) {
    const std::string reference = name + "_ref";
    auto r = mpirun(2, run_args(2, reference, overrides));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (int ranks : resume_ranks) {
      SCOPED_TRACE("resumed on " + std::to_string(ranks) + " rank(s)");
      const std::string out = name + "_kill_np" + std::to_string(ranks);
      ASSERT_NO_FATAL_FAILURE(kill_after_step_5_and_resume(out, overrides, ranks, r));
      ASSERT_NO_FATAL_FAILURE(expect_same_as_reference(out, true, reference));
    }
  }
};

TEST_F(Checkpoints, WrittenOnScheduleWithALatestMarkerAndPruned) {
  const fs::path dir = dir_ / "ck_ref" / "checkpoints";
  EXPECT_EQ(test::read_file(dir / "latest"), "step-00000008.h5\n");
  EXPECT_FALSE(fs::exists(dir / "step-00000002.h5")) << "keep_last = 3 keeps steps 4, 6, 8";
  for (const char* f : {"step-00000004.h5", "step-00000006.h5", "step-00000008.h5"}) EXPECT_TRUE(fs::exists(dir / f)) << f;
}

TEST_F(Checkpoints, KilledRankResumesBitIdentically) {
  // SIGKILL on rank 1 after step 5: the job dies; the step-4 checkpoint is the last complete one.
  test::CommandResult r;
  ASSERT_NO_FATAL_FAILURE(kill_after_step_5_and_resume("ck_kill", "", 2, r));
  EXPECT_NE(r.output.find("resuming from ck_kill/checkpoints/step-00000004.h5"), std::string::npos) << r.output;
  expect_same_as_reference("ck_kill", true);
  // Step 5 ran twice; its first record is marked superseded, so every step is logged once.
  std::vector<int64_t> steps, superseded;
  for (const auto& s : of_type(read_jsonl(dir_ / "ck_kill" / "metrics.jsonl"), "step")) steps.push_back(s.at("step"));
  for (const auto& s : of_type(read_jsonl(dir_ / "ck_kill" / "metrics.jsonl"), "superseded")) superseded.push_back(s.at("step"));
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(superseded, std::vector<int64_t>{5});
}

// hqq_lora (2-bit) resumes like qlora: a run killed after step 5 continues from its step-4
// checkpoint, on the same or another world size, to the uninterrupted run's losses and adapters
// (the base is quantised again at start-up to the same bytes at any world size).
TEST_F(Checkpoints, HqqLoraResumesBitIdenticallyAtAnyWorldSize) {
  expect_resumes_bit_identically("ck_hqq", " --train_type hqq_lora --n_bits 2", {2, 1});
}

// hqq_dora (2-bit) resumes like hqq_lora: the magnitude vectors are sharded, checkpointed and
// restored with the adapters. Without dropout on the same or another world size; with dropout
// (DoRA's path that runs the base weight over the dropped input, its masks regenerated from the
// same keys after the resume) on the same one, as the masks are drawn per rank.
TEST_F(Checkpoints, HqqDoraResumesBitIdentically) {
  for (const std::string dropout : {"0", "0.1"}) {
    SCOPED_TRACE("lora_dropout " + dropout);
    const std::string name = "ck_dora_" + dropout;
    ASSERT_NO_FATAL_FAILURE(expect_resumes_bit_identically(
        name, " --train_type hqq_dora --n_bits 2 --lora_dropout " + dropout,
        dropout == "0" ? std::vector<int>{2, 1} : std::vector<int>{2}));
    // The resumed runs saved exactly the reference's tensors, so its adapter speaks for theirs.
    size_t magnitudes = 0;
    for (const auto& [tensor, values] : saved_weights(dir_ / (name + "_ref")))
      magnitudes += tensor.find("lora_magnitude_vector") != std::string::npos;
    EXPECT_GT(magnitudes, 0u) << "the saved adapter holds the DoRA magnitudes";
  }
}

// bnb_llama_pro resumes like qlora: the new blocks' masters and optimizer state come back from the
// step-4 checkpoint on the same or another world size (the frozen layers are quantised again, to
// the same bytes), to the uninterrupted run's losses and saved model.
TEST_F(Checkpoints, LlamaProResumesBitIdenticallyAtAnyWorldSize) {
  ASSERT_NO_FATAL_FAILURE(
      expect_resumes_bit_identically("ck_pro", " --train_type bnb_llama_pro --llama_pro_num_new_blocks 2", {2, 1}));
  // A checkpoint of another expansion (or of LoRA) cannot continue this run.
  auto r = mpirun(1, run_args(1, "ck_pro_ref", " --train_type bnb_llama_pro --llama_pro_num_new_blocks 1 --resume auto"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("cannot continue this run: model.num_hidden_layers: checkpoint 4, this run 3"),
            std::string::npos)
      << r.output;
  r = mpirun(1, run_args(1, "ck_pro_ref", " --train_type qlora --resume auto"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("cannot continue this run"), std::string::npos) << r.output;
}

TEST_F(Checkpoints, Fp16LossScalerStateResumesExactlyAndRanksSkipTogether) {
  // fp16_autocast from a loss scale that overflows: the first steps are skipped (the overflow flag
  // is agreed over the world, so all ranks skip together), and the scaler's state travels in the checkpoint:
  // a run killed after step 5 and resumed logs the same losses, scales and skips bit for bit.
  const std::string fp16 = " --precision fp16_autocast --loss_scale_init 1048576 --loss_scale_growth_interval 2";
  auto scales = [](const std::string& out) {
    std::map<int64_t, std::pair<double, bool>> s;
    for (const auto& j : of_type(read_jsonl(dir_ / out / "metrics.jsonl"), "step"))
      s[j.at("step").get<int64_t>()] = {j.at("loss_scale").get<double>(), j.at("skipped").get<bool>()};
    return s;
  };
  auto r = mpirun(2, run_args(2, "ck_fp16_ref", fp16));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto want = scales("ck_fp16_ref");
  ASSERT_EQ(want.size(), 8u);
  int skipped = 0;
  for (const auto& [step, s] : want) skipped += s.second;
  EXPECT_GE(skipped, 1) << "2^20 must overflow at first";
  EXPECT_LE(skipped, 6) << "and fit after a few halvings";

  ASSERT_NO_FATAL_FAILURE(kill_after_step_5_and_resume("ck_fp16", fp16, 2, r));
  EXPECT_EQ(scales("ck_fp16"), want);
  EXPECT_EQ(losses_by_step(dir_ / "ck_fp16"), losses_by_step(dir_ / "ck_fp16_ref"));
  EXPECT_EQ(max_relative_difference(saved_weights(dir_ / "ck_fp16"), saved_weights(dir_ / "ck_fp16_ref")), 0.0);
  // (Which steps overflow depends on the layout, as in PyTorch: each micro-batch backpropagates
  // loss / gradient_accumulation_steps, so 2 ranks × 2 micro-batches carry twice the activation
  // gradients of 1 rank × 4 and overflow at half the scale — measured: one more skipped step.)
}

TEST_F(Checkpoints, KilledDuringACheckpointWriteResumesFromThePreviousOne) {
  auto r = mpirun(2, run_args(2, "ck_write"), "FSDPQ_INJECT_FAULT=0:checkpoint_write_6:kill");
  ASSERT_NE(r.exit_code, 0) << r.output;
  const fs::path dir = dir_ / "ck_write" / "checkpoints";
  EXPECT_FALSE(fs::exists(dir / "step-00000006.h5")) << "a half-written checkpoint never gets its final name";
  EXPECT_EQ(test::read_file(dir / "latest"), "step-00000004.h5\n");
  r = mpirun(2, run_args(2, "ck_write", "--resume auto"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_same_as_reference("ck_write", true);
}

TEST_F(Checkpoints, ResumesAtOtherWorldSizesWithTheSameGlobalBatch) {
  // Written at 4 ranks (1 micro-batch each), continued at 2 (2 each); written at 1, continued at 4.
  auto r = mpirun(4, run_args(4, "ck_4to2", "", 4));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = mpirun(2, run_args(2, "ck_4to2", "--resume auto"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("(made on 4 ranks)"), std::string::npos) << r.output;
  expect_same_as_reference("ck_4to2", false);

  r = mpirun(1, run_args(1, "ck_1to4", "", 2));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = mpirun(4, run_args(4, "ck_1to4", "--resume auto --sharding_strategy hybrid_full_shard --ranks_per_node 2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_same_as_reference("ck_1to4", false);
}

// ---- Packing (docs/packing.md) ----------------------------------------------------------------

// 4 rows of up to 256 tokens per step (about three demo examples a row), a checkpoint every 2 steps.
const std::string kPacked = " --packing true --context_length 256";


// The same rows per step at 1, 2 and 4 ranks (dealt by tokens, one row per micro-batch): the same
// objective, as the unpacked Equivalence test argues; and the metrics report the real tokens. In
// fp32: the world sizes sum the gradients in other orders (~1e-7 apart), and in bf16 a weight's
// compute copy now and then rounds the other way, which 8 steps at lr 2e-3 grow past 1e-5 of the
// loss for some seeds, whichever order the layer's own sums take.
TEST_F(Checkpoints, PackedRunsAgreeAtAnyWorldSizeAndReportRealTokens) {
  const std::string packed = kPacked + " --precision fp32";
  auto r = mpirun(1, run_args(1, "pk_np1", packed));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int ranks : {2, 4}) {
    const std::string out = "pk_np" + std::to_string(ranks);
    r = mpirun(ranks, run_args(ranks, out, packed));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    SCOPED_TRACE(out);
    expect_same_losses(dir_ / out, dir_ / "pk_np1", false);
  }
  for (const auto& step : of_type(read_jsonl(dir_ / "pk_np1" / "metrics.jsonl"), "step")) {
    const double tokens = step.at("tokens").get<double>(), real = step.at("real_tokens").get<double>();
    EXPECT_GT(real, 0.0);
    EXPECT_EQ(step.at("padded_slots").get<double>(), tokens - real);
    EXPECT_GT(step.at("packing_efficiency").get<double>(), 0.8) << "rows are padded to the longest row only";
    EXPECT_NEAR(step.at("real_tokens_per_second").get<double>() / step.at("tokens_per_second").get<double>(),
                real / tokens, 1e-9);
    // samples are the rows; examples what they hold (about three a row here).
    EXPECT_GT(step.at("examples").get<double>(), step.at("samples").get<double>());
  }
  const auto summary = of_type(read_jsonl(dir_ / "pk_np1" / "metrics.jsonl"), "summary").at(0);
  EXPECT_GT(summary.at("real_tokens_per_second").get<double>(), 0.0);
  EXPECT_LE(summary.at("real_tokens_per_second").get<double>(), summary.at("tokens_per_second").get<double>());
}

// padding_free: each step's 4 examples in one row with no padding train what the padded rows train
// (fp32: the losses within summation-order rounding), and the metrics count no padded slot and the
// examples as samples, as unpacked.
TEST_F(Checkpoints, PaddingFreeTrainsThePaddedRunsObjectiveWithNoPadding) {
  const std::string batch = " --precision fp32 --batch_size 4 --gradient_accumulation_steps 1";
  auto r = mpirun(1, run_args(1, "pf_padded", batch));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = mpirun(1, run_args(1, "pf_free", batch + " --padding_free true"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_same_losses(dir_ / "pf_free", dir_ / "pf_padded", false);
  const auto padded = of_type(read_jsonl(dir_ / "pf_padded" / "metrics.jsonl"), "step");
  const auto free = of_type(read_jsonl(dir_ / "pf_free" / "metrics.jsonl"), "step");
  ASSERT_EQ(free.size(), padded.size());
  bool padding_seen = false;
  for (size_t i = 0; i < free.size(); ++i) {
    EXPECT_EQ(free[i].at("padded_slots").get<double>(), 0.0);
    EXPECT_EQ(free[i].at("real_tokens").get<double>(), padded[i].at("real_tokens").get<double>());
    EXPECT_EQ(free[i].at("samples").get<double>(), 4.0);
    EXPECT_EQ(free[i].at("examples").get<double>(), 4.0);
    padding_seen = padding_seen || padded[i].at("padded_slots").get<double>() > 0;
  }
  EXPECT_TRUE(padding_seen) << "the padded run pads";
}

// Killed after step 5 and resumed from the step-4 checkpoint: the same rows follow, bit for bit on
// the same world size, within summation-order rounding on another; an unpacked run refuses it.
// (Mixing the two would continue from the wrong place: one position counts rows, the other examples.)
TEST_F(Checkpoints, PackedRunResumesExactlyMidEpoch) {
  auto r = mpirun(2, run_args(2, "pk_ref", kPacked));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = mpirun(2, run_args(2, "pk_kill", kPacked), "FSDPQ_INJECT_FAULT=1:after_step_5:kill");
  ASSERT_NE(r.exit_code, 0) << r.output;
  EXPECT_EQ(test::read_file(dir_ / "pk_kill" / "checkpoints" / "latest"), "step-00000004.h5\n");
  fs::copy(dir_ / "pk_kill", dir_ / "pk_kill_np1", fs::copy_options::recursive);
  r = mpirun(2, run_args(2, "pk_kill", kPacked + " --resume auto"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_same_losses(dir_ / "pk_kill", dir_ / "pk_ref", true);

  r = mpirun(1, run_args(1, "pk_kill_np1", kPacked + " --resume auto"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_same_losses(dir_ / "pk_kill_np1", dir_ / "pk_ref", false);

  r = mpirun(2, run_args(2, "pk_ref", " --context_length 256 --resume pk_ref/checkpoints/step-00000004.h5"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("made with packing = true"), std::string::npos) << r.output;
  // ...and a packed run refuses an unpacked run's checkpoint (its position counts examples).
  r = mpirun(2, run_args(2, "pk_from_unpacked", kPacked + " --resume ck_ref/checkpoints/step-00000004.h5"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("packing: not in the checkpoint"), std::string::npos) << r.output;
}

TEST_F(Checkpoints, PreemptionSignalOnOneRankCheckpointsEveryRankAndExits75) {
  // Rank 1 alone gets SIGUSR1 after step 3 (as from Slurm's --signal): all ranks stop after that
  // step with a checkpoint of it, exit 75, and the requeued job finishes the run.
  auto r = mpirun(2, run_args(2, "ck_usr1"), "FSDPQ_INJECT_FAULT=1:after_step_3:usr1");
  EXPECT_EQ(r.exit_code, 75) << r.output;
  EXPECT_NE(r.output.find("SIGUSR1 received: checkpoint of step 3 written"), std::string::npos) << r.output;
  EXPECT_EQ(test::read_file(dir_ / "ck_usr1" / "checkpoints" / "latest"), "step-00000003.h5\n");
  r = mpirun(2, run_args(2, "ck_usr1", "--resume auto"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_same_as_reference("ck_usr1", true);
}

TEST_F(Checkpoints, APreemptionNoticeDuringStartUpExits75AndTheRequeuedJobStartsOver) {
  // SIGUSR1 to rank 1 while the data loads: no checkpoint to write, exit 75 at once (not 138).
  auto r = mpirun(2, run_args(2, "ck_startup"), "FSDPQ_INJECT_FAULT=1:load_data:usr1");
  EXPECT_EQ(r.exit_code, 75) << r.output;
  EXPECT_NE(r.output.find("fsdpq (rank 1): SIGUSR1 received during start-up: nothing to checkpoint yet; exiting with "
                          "code 75 so the job can be requeued"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(dir_ / "ck_startup" / "checkpoints" / "latest"));
  // SIGTERM to a single process after its model is loaded: the same (not 143).
  r = mpirun(1, run_args(1, "ck_startup"), "FSDPQ_INJECT_FAULT=0:after_load:term");
  EXPECT_EQ(r.exit_code, 75) << r.output;
  EXPECT_NE(r.output.find("SIGTERM received during start-up"), std::string::npos) << r.output;
  // The requeued job (resume = auto, as the Slurm scripts run it) starts from step 0 and matches.
  r = mpirun(2, run_args(2, "ck_startup", "--resume auto"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("no checkpoint in ck_startup/checkpoints yet, starting from step 0"), std::string::npos)
      << r.output;
  expect_same_as_reference("ck_startup", true);
}

TEST_F(Checkpoints, SigtermToTheJobCheckpointsAndExits75) {
  // A long run, signalled from outside once it is training. Slurm signals the tasks themselves
  // (mpirun would kill its job on SIGTERM), so the test signals the rank processes directly.
  const std::string out = "ck_term";
  const std::string cmd = "cd '" + dir_.string() + "' && (" + MPIEXEC + " --allow-run-as-root --oversubscribe -np 2 '" +
                          FSDPQ_BINARY + "' " + args("lora", 2, out, 100000) +
                          " --num_epochs 1000 > ck_term.log 2>&1; echo $? > ck_term.rc) > /dev/null 2>&1 &";
  ASSERT_EQ(run_command(cmd).exit_code, 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (losses_by_step(dir_ / out).size() < 2 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_GE(losses_by_step(dir_ / out).size(), 2u) << test::read_file(dir_ / "ck_term.log");
  // Only the ranks (their command line starts with the binary), not mpirun or the shell.
  run_command("pkill -TERM -f -- '^" + std::string(FSDPQ_BINARY) + " .*--output_dir " + out + "( |$)'; true");
  while (!fs::exists(dir_ / "ck_term.rc") && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_TRUE(fs::exists(dir_ / "ck_term.rc")) << "the job did not stop";
  EXPECT_EQ(test::read_file(dir_ / "ck_term.rc"), "75\n") << test::read_file(dir_ / "ck_term.log");
  EXPECT_NE(test::read_file(dir_ / "ck_term.log").find("SIGTERM received"), std::string::npos);
  EXPECT_TRUE(fs::exists(dir_ / out / "checkpoints" / "latest"));
}

TEST_F(Checkpoints, DamagedOrForeignCheckpointsAreRefusedClearly) {
  const fs::path good = dir_ / "ck_ref" / "checkpoints" / "step-00000004.h5";
  // Cut short.
  fs::copy_file(good, dir_ / "truncated.h5", fs::copy_options::overwrite_existing);
  fs::resize_file(dir_ / "truncated.h5", fs::file_size(good) / 2);
  auto r = mpirun(2, run_args(2, "ck_bad", "--resume truncated.h5"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("truncated.h5"), std::string::npos) << r.output;
  // One byte flipped anywhere (here: mid-file, in HDF5's own structures, which HDF5 would crash
  // on): the digest written with the checkpoint catches it before HDF5 opens the file.
  {
    std::string bytes = test::read_file(good);
    bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 0x5a);
    test::write_file(dir_ / "flipped.h5", bytes);
    fs::copy_file(good.string() + ".digest", dir_ / "flipped.h5.digest", fs::copy_options::overwrite_existing);
  }
  r = mpirun(2, run_args(2, "ck_bad", "--resume flipped.h5"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("checkpoint 'flipped.h5' is corrupt: its bytes no longer match the digest"), std::string::npos)
      << r.output;
  // Not a checkpoint at all.
  test::write_file(dir_ / "garbage.h5", "this is not HDF5\n");
  r = mpirun(2, run_args(2, "ck_bad", "--resume garbage.h5"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("garbage.h5"), std::string::npos) << r.output;
  // Another LoRA shape.
  r = mpirun(2, run_args(2, "ck_bad", "--resume " + good.string() + " --lora_rank 8"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("cannot continue this run: lora.rank: checkpoint 4, this run 8"), std::string::npos) << r.output;
  // Another global batch.
  r = mpirun(2, run_args(2, "ck_bad", "--resume " + good.string() + " --gradient_accumulation_steps 1"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("global_batch: checkpoint 4, this run 2"), std::string::npos) << r.output;
  // Missing.
  r = mpirun(2, run_args(2, "ck_bad", "--resume nowhere.h5"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("nowhere.h5"), std::string::npos) << r.output;
}

// The checkpoint records a fingerprint of the frozen base and the tokenizer: continuing it on
// another model of the same shape is refused, saying what differs, unless resume_ignore_model.
TEST_F(Checkpoints, ResumeOntoAnotherBaseOfTheSameShapeIsRefusedUnlessIgnored) {
  const fs::path good = dir_ / "ck_ref" / "checkpoints" / "step-00000004.h5";
  const fs::path other = dir_ / "other_model";
  fs::remove_all(other);
  fs::copy(dir_ / "demo" / "model", other, fs::copy_options::recursive);
  {  // Zeros over the last 64 bytes of the weights: the file's last tensor differs, nothing else.
    std::string bytes = test::read_file(other / "model.safetensors");
    std::fill(bytes.end() - 64, bytes.end(), '\0');
    test::write_file(other / "model.safetensors", bytes);
  }
  auto r = mpirun(2, run_args(2, "ck_other", "--resume " + good.string() + " --model_name other_model"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("was made on another base than this run's: the base weights: 1 of "), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("set resume_ignore_model = true to continue anyway"), std::string::npos) << r.output;
  // Another tokenizer (its 259 ids fit the model's 512; bytes need a longer context to keep answers).
  r = mpirun(2, run_args(2, "ck_other", "--resume " + good.string() + " --tokenizer_path builtin:bytes --context_length 1024"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("the tokenizer: checkpoint sentencepiece"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("this run builtin:bytes"), std::string::npos) << r.output;
  // The dry run fails where the run would.
  r = mpirun(2, run_args(2, "ck_other", "--resume " + good.string() + " --model_name other_model --dry_run true"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("was made on another base than this run's"), std::string::npos) << r.output;
  // Overridden: it continues, with a warning.
  r = mpirun(2, run_args(2, "ck_other", "--resume " + good.string() + " --model_name other_model --resume_ignore_model true"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("continuing (resume_ignore_model = true)"), std::string::npos) << r.output;
}

TEST_F(Checkpoints, TheDryRunChecksTheCheckpointItWouldResume) {
  const fs::path good = dir_ / "ck_ref" / "checkpoints" / "step-00000004.h5";
  auto r = mpirun(2, run_args(2, "ck_dry", "--resume " + good.string() + " --lora_rank 8 --dry_run true"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("cannot continue this run: lora.rank: checkpoint 4, this run 8"), std::string::npos) << r.output;
  r = mpirun(2, run_args(2, "ck_dry", "--resume " + good.string() + " --dry_run true"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("can continue this run"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir_ / "ck_dry")) << "a dry run creates no directory";
}

TEST_F(Checkpoints, ResumingAtTheLastStepTrainsNothingAndKeepsTheLastLoss) {
  const fs::path last = dir_ / "ck_ref" / "checkpoints" / "step-00000008.h5";
  auto r = mpirun(2, run_args(2, "ck_end", "--resume " + last.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("nothing left to train: the run is at step 8 and ends at step 8 (max_steps = 8)"),
            std::string::npos) << r.output;
  const auto summary = of_type(read_jsonl(dir_ / "ck_end" / "metrics.jsonl"), "summary");
  ASSERT_EQ(summary.size(), 1u);
  EXPECT_EQ(summary[0].at("last_loss").get<double>(), losses_by_step(dir_ / "ck_ref").at(8));
  EXPECT_EQ(r.output.find("→ 0.0000"), std::string::npos) << r.output;
}

TEST_F(Checkpoints, AFailureOnOneRankMidTrainingEndsEveryRankPromptly) {
  const auto start = std::chrono::steady_clock::now();
  auto r = mpirun(2, run_args(2, "ck_fail"), "FSDPQ_INJECT_FAULT=1:after_step_2");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.exit_code, 124) << "timed out: a rank hung";
  EXPECT_NE(r.output.find("injected fault at after_step_2"), std::string::npos) << r.output;
  EXPECT_LT(seconds, 60.0);
}

// ---- The watchdog -------------------------------------------------------------------------------

// A rank that stops (SIGSTOP: nothing of it runs, its watchdog neither), or hangs while alive, no
// longer hangs the job: after collective_timeout_s the waiting rank asks the others, names the one
// that stalled and how, and ends the job with exit code 76. A rank that is slow but still making
// progress only extends the wait.
TEST_F(FsdpTrain, AStalledRankEndsTheJobNamingItAndASlowOneDoesNot) {
  struct Case {
    std::string action, words;
    int exit_code;
  };
  for (const Case& c : {Case{"stop", "rank 1 (", 76}, Case{"hang", "rank 1 (", 76}, Case{"slow", "", 0}}) {
    SCOPED_TRACE(c.action);
    const auto start = std::chrono::steady_clock::now();
    auto r = mpirun(2, args("lora", 2, "watchdog_" + c.action, 4) + " --collective_timeout_s 3",
                    "FSDPQ_INJECT_FAULT=1:after_step_2:" + c.action);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(r.exit_code, c.exit_code) << r.output;
    EXPECT_LT(seconds, 90.0) << "the job hung";
    if (c.action == "stop") {
      EXPECT_NE(r.output.find("fsdpq: rank 0 ("), std::string::npos) << r.output;
      EXPECT_NE(r.output.find("(collective_timeout_s = 3):\n  rank 1 ("), std::string::npos) << r.output;
      EXPECT_NE(r.output.find("): did not answer within 10 s: its process is stopped or frozen"), std::string::npos)
          << r.output;
      EXPECT_NE(r.output.find("fsdpq: stopping the job (exit code 76)"), std::string::npos) << r.output;
    } else if (c.action == "hang") {
      EXPECT_NE(r.output.find("): alive but stuck, not waiting for the others: training, step 2 (last progress"),
                std::string::npos)
          << r.output;
    } else {
      EXPECT_NE(r.output.find("in all-reduce on 'world'; waiting longer, since:\n  rank 1 ("), std::string::npos)
          << r.output;
      EXPECT_NE(r.output.find("): still working: training, step 2 (last progress "), std::string::npos) << r.output;
      EXPECT_EQ(step_losses(dir_ / "watchdog_slow").size(), 4u);
    }
  }
}

// ---- Run directories ----------------------------------------------------------------------------

// A second run into a directory a run is writing stops at once, naming the other process; a fresh
// run into a finished run's directory is refused until it says --resume auto or --overwrite true.
TEST_F(FsdpTrain, ARunDirectoryHoldsOneRunAtATime) {
  const std::string out = "one_dir";
  ASSERT_EQ(run_command("cd '" + dir_.string() + "' && ('" + FSDPQ_BINARY + "' " + args("lora", 1, out, 100000) +
                        " --num_epochs 1000 > one_dir.log 2>&1 &)").exit_code, 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (step_losses(dir_ / out).empty() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_FALSE(step_losses(dir_ / out).empty()) << test::read_file(dir_ / "one_dir.log");
  auto second = mpirun(1, args("lora", 1, out, 2));
  auto resumed = mpirun(1, args("lora", 1, out, 2) + " --resume auto");
  run_command("pkill -KILL -f -- '^" + std::string(FSDPQ_BINARY) + " .*--output_dir " + out + "( |$)'; true");
  EXPECT_EQ(second.exit_code, 2) << second.output;
  EXPECT_NE(second.output.find("output_dir '" + out + "' is in use by another fsdpq run (pid "), std::string::npos)
      << second.output;
  EXPECT_EQ(resumed.exit_code, 2) << resumed.output;
  EXPECT_NE(resumed.output.find("is in use by another fsdpq run"), std::string::npos) << resumed.output;

  // The killed run's directory now holds a previous run: a fresh run is refused ...
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the kernel releases the lock with the process
  const size_t logged = step_losses(dir_ / out).size();
  auto fresh = mpirun(1, args("lora", 1, out, 2));
  EXPECT_EQ(fresh.exit_code, 2) << fresh.output;
  EXPECT_NE(fresh.output.find("output_dir '" + out + "' holds a previous run (metrics.jsonl with " +
                              std::to_string(logged) + " step"),
            std::string::npos)
      << fresh.output;
  EXPECT_NE(fresh.output.find("`--resume auto` continues it, `--overwrite true` replaces it"), std::string::npos)
      << fresh.output;
  EXPECT_EQ(step_losses(dir_ / out).size(), logged) << "nothing of the previous run was touched";
  // ... and replaced on request.
  auto replaced = mpirun(1, args("lora", 1, out, 2) + " --overwrite true");
  EXPECT_EQ(replaced.exit_code, 0) << replaced.output;
  EXPECT_NE(replaced.output.find("overwrite = true: removed the previous run's files"), std::string::npos)
      << replaced.output;
  EXPECT_EQ(of_type(read_jsonl(dir_ / out / "metrics.jsonl"), "header").size(), 1u);
  EXPECT_EQ(step_losses(dir_ / out).size(), 2u);
}

TEST_F(FsdpTrain, AnUnusableOutputOrCheckpointDirectoryStopsTheRunBeforeLoading) {
  test::write_file(dir_ / "a_file", "x");
  auto r = mpirun(2, args("lora", 2, "ok_out", 2) + " --checkpoint_dir a_file/checkpoints");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("checkpoint_dir 'a_file/checkpoints': cannot create the directory: Not a directory"),
            std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("model ready"), std::string::npos) << "found before the model is loaded";
  r = mpirun(1, args("lora", 2, "a_file/out", 2));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("output_dir 'a_file/out': cannot create the directory: Not a directory"), std::string::npos)
      << r.output;
}

// profile = true: each rank writes a chrome-trace timeline that parses as JSON and holds every
// step, its passes and optimizer, and (two ranks: units are gathered) the gather waits and
// reductions; profile_memory adds memory records around every pass and step.
TEST_F(FsdpTrain, ProfileWritesAPerRankTraceAndMemoryRecords) {
  auto r = mpirun(2, args("qlora", 2, "profiled", 3) + " --profile true --profile_memory true");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int rank = 0; rank < 2; ++rank) {
    const fs::path path = dir_ / "profiled" / ("trace.rank" + std::to_string(rank) + ".json");
    std::ifstream in(path);
    ASSERT_TRUE(in) << path;
    const nlohmann::json events = nlohmann::json::parse(in);
    std::map<std::string, int> count;
    for (const auto& e : events) {
      if (e.at("ph") != "X") continue;
      EXPECT_EQ(e.at("pid").get<int>(), rank) << e.dump();
      EXPECT_GE(e.at("dur").get<double>(), 0.0) << e.dump();
      const std::string name = e.at("name");
      count[name.substr(0, name.find(' '))]++;
    }
    EXPECT_EQ(count["step"], 3) << path;
    EXPECT_EQ(count["forward_backward"], 3 * 2) << "gradient_accumulation_steps 2 at 2 ranks";
    EXPECT_EQ(count["optimizer"], 3);
    EXPECT_GT(count["gather"], 0) << "full_shard over 2 ranks gathers every layer";
    EXPECT_GT(count["reduce"], 0);
  }
  std::map<std::string, int> memory_at;
  for (const auto& m : of_type(read_jsonl(dir_ / "profiled" / "metrics.jsonl"), "memory")) memory_at[m.at("at")]++;
  EXPECT_EQ(memory_at["before_forward_backward"], 6);
  EXPECT_EQ(memory_at["after_forward_backward"], 6);
  EXPECT_EQ(memory_at["after_forward"], 6);
  EXPECT_EQ(memory_at["after_first_forward"], 1);
  EXPECT_EQ(memory_at["after_optimizer"], 3);
  EXPECT_EQ(memory_at["after_load"], 1);
}

// With use_cpu_offload on one rank the worker thread's jobs are on the trace too, on a lane of
// their own, with the main thread's waits on them: what an offload run's step time is made of.
TEST_F(FsdpTrain, ProfileTracesTheOffloadWorker) {
  auto r = mpirun(1, args("qlora", 2, "profiled_offload", 3) +
                         " --profile true --use_cpu_offload true --apply_gradient_clipping true");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(dir_ / "profiled_offload" / "trace.rank0.json");
  ASSERT_TRUE(in);
  const nlohmann::json events = nlohmann::json::parse(in);
  std::map<std::string, int> count;
  std::map<std::string, std::set<std::string>> lanes;
  for (const auto& e : events) {
    if (e.at("ph") != "X") continue;
    EXPECT_GE(e.at("dur").get<double>(), 0.0) << e.dump();
    const std::string name = e.at("name");
    const std::string what = name.starts_with("step ") ? "step" : name.substr(0, name.find(" ("));
    count[what]++;
    lanes[what].insert(e.at("tid").get<std::string>());
  }
  for (const char* worker_job : {"host copy-out wait", "host accumulate", "host update"}) {
    EXPECT_GT(count[worker_job], 0) << worker_job;
    EXPECT_EQ(lanes[worker_job], std::set<std::string>{"host worker"}) << worker_job;
  }
  // Clipping queues each unit's update after the norm; the next step's forward waits for them.
  EXPECT_EQ(count["norm wait"], 3);
  EXPECT_GT(count["update wait"], 0);
  EXPECT_EQ(count["step"], 3);
}

}  // namespace
}  // namespace fsdpq
