// `fsdpq generate` through the real binary on a tiny random model with the byte tokenizer:
// determinism, adapters, limits, and bad input with exact messages.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <regex>

#include "io/peft_adapter.h"
#include "model/llama_config.h"
#include "random_adapter.h"
#include "test_support.h"
#include "tiny_model_suite.h"

namespace fsdpq {
namespace {

namespace fs = std::filesystem;
using test::error_message;
using test::quoted;
using test::run_command;
using test::run_fsdpq;

struct Generation {
  int exit_code = -1;
  std::string text;    // stdout: the continuation
  std::string diagnostics;  // stderr: the summary line or the error
  int64_t new_tokens = -1;
  std::string stopped;
};

class Generate : public test::TinyModelSuite<Generate> {
 protected:
  static void SetUpTestSuite() { make_tiny_model("generate", 3); }

  // Runs generate with stdout and stderr apart.
  static Generation generate(const std::string& args) {
    static int count = 0;
    const fs::path out = dir_ / ("stdout_" + std::to_string(count++));
    // run_command adds 2>&1 after the group: stderr comes back, stdout goes to the file.
    auto r = run_command(std::string("{ '") + FSDPQ_BINARY + "' generate " + args + " > " + quoted(out) + "; }");
    Generation g;
    g.exit_code = r.exit_code;
    g.diagnostics = r.output;
    g.text = fs::exists(out) ? test::read_file(out) : "";
    std::smatch m;
    static const std::regex summary(R"(\+ (\d+) new tokens \(stopped at (\w+)\))");
    if (std::regex_search(g.diagnostics, m, summary)) {
      g.new_tokens = std::stoll(m[1]);
      g.stopped = m[2];
    }
    return g;
  }
  static std::string model_args() { return "--model " + quoted(dir_ / "model") + " --tokenizer builtin:bytes "; }

  // An adapter on q_proj and v_proj of both layers; B ~ U(-b_range, b_range) (0: B = 0, a no-op).
  static fs::path make_adapter(const std::string& name, float b_range) {
    return test::write_random_adapter(dir_ / name, config_,
                                      {.r = 4, .alpha = 8, .targets = {"q_proj", "v_proj"}, .b_range = b_range, .seed = 7});
  }
};

TEST_F(Generate, GreedyIsDeterministicAndRespectsMaxNewTokens) {
  const std::string args = model_args() + "--prompt 'Hello there' --temperature 0 --max_new_tokens 12";
  const Generation a = generate(args), b = generate(args);
  ASSERT_EQ(a.exit_code, 0) << a.diagnostics;
  EXPECT_EQ(a.text, b.text);
  EXPECT_NE(a.diagnostics.find("generate: 12 prompt tokens + "), std::string::npos) << a.diagnostics;  // BOS + 11 bytes
  // A random model rarely says EOS; when it does, it stops early.
  if (a.stopped == "EOS") {
    EXPECT_LT(a.new_tokens, 12);
  } else {
    EXPECT_EQ(a.stopped, "max_new_tokens") << a.diagnostics;
    EXPECT_EQ(a.new_tokens, 12);
  }
  // Byte tokens decode to at most one byte each, plus the final newline.
  EXPECT_LE(a.text.size(), static_cast<size_t>(a.new_tokens) + 1);
  ASSERT_FALSE(a.text.empty());
  EXPECT_EQ(a.text.back(), '\n');

  // Greedy decoding does not depend on the limit: fewer tokens give a prefix of the same text.
  const Generation shorter = generate(model_args() + "--prompt 'Hello there' --temperature 0 --max_new_tokens 4");
  ASSERT_EQ(shorter.exit_code, 0) << shorter.diagnostics;
  EXPECT_LE(shorter.new_tokens, 4);
  const std::string prefix = shorter.text.substr(0, shorter.text.size() - 1);
  EXPECT_EQ(a.text.compare(0, prefix.size(), prefix), 0) << "'" << shorter.text << "' vs '" << a.text << "'";

  // bf16 NF4 (qlora), bf16 (lora) and fp32 all run.
  for (const char* extra : {"--train_type lora", "--train_type lora --precision fp32", "--precision fp32"}) {
    const Generation g = generate(args + " " + extra);
    EXPECT_EQ(g.exit_code, 0) << extra << "\n" << g.diagnostics;
    EXPECT_GT(g.new_tokens, 0) << extra;
  }
}

TEST_F(Generate, SamplingIsReproduciblePerSeed) {
  const std::string args = model_args() + "--prompt 'abc' --temperature 1.0 --top_p 0.95 --max_new_tokens 24 ";
  const Generation a = generate(args + "--seed 11"), again = generate(args + "--seed 11");
  ASSERT_EQ(a.exit_code, 0) << a.diagnostics;
  EXPECT_EQ(a.text, again.text);
  // Another seed gives another text (a random model is close to uniform over 300 tokens).
  bool any_differs = false;
  for (int seed = 12; seed < 15 && !any_differs; ++seed) any_differs = generate(args + "--seed " + std::to_string(seed)).text != a.text;
  EXPECT_TRUE(any_differs);
}

TEST_F(Generate, ZeroBAdapterChangesNothingAndATrainedOneDoes) {
  const std::string args = model_args() + "--prompt 'The quick brown fox' --temperature 0 --max_new_tokens 16 ";
  const Generation base = generate(args);
  ASSERT_EQ(base.exit_code, 0) << base.diagnostics;
  for (const char* train_type : {"lora", "qlora"}) {
    const Generation base_tt = generate(args + "--train_type " + train_type);
    const Generation zero = generate(args + "--train_type " + train_type + " --adapter " + quoted(make_adapter("zero", 0.0f)));
    ASSERT_EQ(zero.exit_code, 0) << zero.diagnostics;
    EXPECT_EQ(zero.text, base_tt.text) << train_type;
  }
  // A strong adapter moves the greedy choice (so the adapter is really applied).
  const Generation strong = generate(args + "--adapter " + quoted(make_adapter("strong", 3.0f)));
  ASSERT_EQ(strong.exit_code, 0) << strong.diagnostics;
  EXPECT_NE(strong.text, base.text);
}

TEST_F(Generate, LogitsOutHoldsThePromptAndTheLogitsOfTheFirstChoice) {
  const fs::path file = dir_ / "logits.json";
  const Generation g = generate(model_args() + "--prompt 'Hi!' --temperature 0 --max_new_tokens 1 --train_type lora "
                                "--precision fp32 --logits_out " + quoted(file));
  ASSERT_EQ(g.exit_code, 0) << g.diagnostics;
  const auto j = nlohmann::json::parse(test::read_file(file));
  EXPECT_EQ(j["input_ids"], (std::vector<int32_t>{1, 3 + 'H', 3 + 'i', 3 + '!'}));  // BOS + bytes
  EXPECT_EQ(j["train_type"], "lora");
  EXPECT_EQ(j["precision"], "fp32");
  const auto logits = j["last_logits"].get<std::vector<float>>();
  ASSERT_EQ(logits.size(), 300u);
  // Greedy's one token is the argmax of these logits.
  const int32_t argmax = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  if (argmax >= 3 && argmax < 259) {
    EXPECT_EQ(g.text, std::string(1, static_cast<char>(argmax - 3)) + "\n");
  } else {
    EXPECT_EQ(g.text, "\n") << "ids outside the byte range decode to nothing";
  }
  EXPECT_EQ(g.new_tokens, argmax == 2 ? 0 : 1);
}

TEST_F(Generate, PresetEqualsItsInitModelDirectory) {
  // preset:tiny with --init_seed S has the weights of `init-model --preset tiny --seed S`.
  auto r = run_fsdpq("init-model --preset tiny --seed 5 --out " + quoted(dir_ / "model_32k"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string rest = "--tokenizer builtin:bytes --prompt 'preset' --temperature 0 --max_new_tokens 8";
  const Generation from_dir = generate("--model " + quoted(dir_ / "model_32k") + " " + rest);
  const Generation from_preset = generate("--model preset:tiny --init_seed 5 " + rest);
  ASSERT_EQ(from_dir.exit_code, 0) << from_dir.diagnostics;
  ASSERT_EQ(from_preset.exit_code, 0) << from_preset.diagnostics;
  EXPECT_EQ(from_dir.text, from_preset.text);
  EXPECT_EQ(from_dir.new_tokens, from_preset.new_tokens);
}

TEST_F(Generate, BadInputIsRefusedWithAClearMessage) {
  const std::string m = quoted(dir_ / "model");
  const std::string long_prompt(2048, 'x');  // + BOS = 2049 tokens > 2048 positions
  auto r = run_fsdpq("init-model --preset tiny --vocab_size 100 --out " + quoted(dir_ / "small_vocab"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const fs::path wrong_adapter = test::write_random_adapter(dir_ / "wrong_adapter", test::narrowed_to_hidden_32(config_),
                                                            {.r = 2, .alpha = 4, .targets = {"q_proj"}});
  struct Case {
    std::string args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"--model " + quoted(dir_ / "missing") + " --prompt hi",
       "model directory '" + (dir_ / "missing").string() + "' not found"},
      {"--model " + m + " --tokenizer builtin:bytes --prompt " + long_prompt,
       "generate: the prompt is 2049 tokens (BOS included), longer than the model's max_position_embeddings (2048)"},
      {"--model " + m + " --prompt hi", "generate: model directory '" + (dir_ / "model").string() +
                                            "' has no tokenizer.model or tokenizer.json: pass --tokenizer PATH (a "
                                            "tokenizer.model, a tokenizer.json, or builtin:bytes)"},
      {"--model preset:tiny --prompt hi",
       "generate: --model preset:tiny has no tokenizer: pass --tokenizer PATH (a tokenizer.model, a tokenizer.json, "
       "or builtin:bytes)"},
      {"--model " + quoted(dir_ / "small_vocab") + " --tokenizer builtin:bytes --prompt hi",
       "generate: the tokenizer (builtin:bytes (259 ids: <unk>, <s>, </s> and the 256 byte values)) has 259 tokens but "
       "the model's vocab_size is 100: its ids would fall outside the embedding"},
      {"--model " + m + " --tokenizer builtin:bytes --prompt hi --temperature -1",
       "--temperature -1: must be a number >= 0 (0 = greedy decoding)"},
      {"--model " + m + " --tokenizer builtin:bytes --prompt hi --temperature warm",
       "generate: --temperature warm: expected a number"},
      {"--model " + m + " --tokenizer builtin:bytes --prompt hi --top_p 0", "--top_p 0: must be in (0, 1] (1 keeps every token)"},
      {"--model " + m + " --tokenizer builtin:bytes --prompt hi --max_new_tokens 0",
       "generate: --max_new_tokens 0: must be between 1 and 1000000"},
      {"--model " + m + " --tokenizer builtin:bytes --prompt hi --train_type full",
       "generate: --train_type full: must be qlora or bnb_dora (NF4 base) or lora (bf16 base)"},
      {"--model " + m + " --tokenizer builtin:bytes --prompt hi --precision fp16",
       "generate: --precision fp16: must be bf16 or fp32"},
      {"--model " + m + " --tokenizer builtin:bytes --prompt hi --seed -3", "generate: --seed -3: must be a non-negative integer"},
      {"--model " + m + " --tokenizer builtin:bytes --prompt hi --init_seed 1",
       "generate: --init_seed only applies to --model preset:NAME (a model directory has its weights)"},
      {"--model " + m + " --tokenizer builtin:bytes", "generate: --prompt TEXT is required"},
      {"--model " + m + " --tokenizer builtin:bytes --prompt hi --max_tokens 3",
       "generate: unknown flag --max_tokens (fsdpq generate --help lists the flags)"},
      {"--model " + m + " --tokenizer builtin:bytes --prompt hi --adapter " + quoted(dir_ / "no_adapter"),
       "adapter directory '" + (dir_ / "no_adapter").string() + "' does not exist or is not a directory"},
      {"--model " + m + " --tokenizer builtin:bytes --prompt hi --adapter " + quoted(wrong_adapter),
       "adapter tensor 'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight' has shape [2, 32] but this "
       "model needs [2, 64] (lora_rank 2; lora_A is [r, in], lora_B [out, r])"},
  };
  for (const auto& c : cases) {
    const Generation g = generate(c.args);
    EXPECT_EQ(g.exit_code, 2) << c.args.substr(0, 200) << "\n" << g.diagnostics;
    EXPECT_EQ(error_message(g.diagnostics), c.message) << c.args.substr(0, 200);
    EXPECT_EQ(g.text, "") << "nothing on stdout when refused";
  }
}

}  // namespace
}  // namespace fsdpq
