// init_model: a randomly initialised HF model directory, deterministic per seed.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>

#include "io/model_files.h"
#include "model/init_model.h"
#include "model/presets.h"
#include "test_support.h"
#include "util/bf16.h"
#include "util/error.h"
#include "util/strings.h"

namespace fsdpq {
namespace {

namespace fs = std::filesystem;

using test::error_of;

std::vector<float> values_of(const ModelWeights& w, const std::string& name) {
  auto bytes = w.bytes(name);
  std::vector<float> out(bytes.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    uint16_t b;
    std::memcpy(&b, bytes.data() + 2 * i, 2);
    out[i] = bf16_to_float(b);
  }
  return out;
}

std::string file_bytes(const fs::path& p) { return test::read_file(p); }

TEST(InitModel, TinyWritesAnHfDirectory) {
  const fs::path out = test::make_temp_dir("init_tiny") / "tiny";
  const LlamaConfig config = preset_or_fail("tiny");
  init_model(config, out, {});

  EXPECT_TRUE(fs::exists(out / "config.json"));
  EXPECT_TRUE(fs::exists(out / "generation_config.json"));
  EXPECT_TRUE(fs::exists(out / "model.safetensors"));
  EXPECT_FALSE(fs::exists(out / "tokenizer.model"));
  // The config reads back as the same model.
  const LlamaConfig back = load_llama_config(out / "config.json");
  EXPECT_EQ(back.hidden_size, 64);
  EXPECT_EQ(back.num_key_value_heads, 2);
  const auto generation = nlohmann::json::parse(test::read_file(out / "generation_config.json"));
  EXPECT_EQ(generation["bos_token_id"], 1);
  EXPECT_EQ(generation["eos_token_id"], 2);

  // Names, order, shapes and dtype are exactly hf_tensor_specs.
  ModelWeights w = ModelWeights::open(out);
  const auto specs = hf_tensor_specs(config);
  std::vector<std::string> names;
  for (const auto& s : specs) {
    names.push_back(s.name);
    const TensorInfo* info = w.find(s.name);
    ASSERT_NE(info, nullptr) << s.name;
    EXPECT_EQ(info->shape, s.shape) << s.name;
    EXPECT_EQ(info->dtype, DType::BF16) << s.name;
  }
  EXPECT_EQ(w.tensor_names(), names);
  EXPECT_EQ(w.file_of(names[0]).metadata().at("format"), "pt");
  // Nothing temporary is left beside the model.
  std::vector<std::string> siblings;
  for (const auto& e : fs::directory_iterator(out.parent_path())) siblings.push_back(e.path().filename().string());
  EXPECT_EQ(siblings, std::vector<std::string>{"tiny"});
}

TEST(InitModel, NormsAreOneAndWeightsNormal) {
  const fs::path out = test::make_temp_dir("init_stats") / "m";
  const LlamaConfig config = preset_or_fail("tiny");
  init_model(config, out, {.seed = 3});
  ModelWeights w = ModelWeights::open(out);

  std::vector<float> linear;  // every linear weight of every layer, pooled
  for (const auto& s : hf_tensor_specs(config)) {
    const auto v = values_of(w, s.name);
    if (ends_with(s.name, "norm.weight")) {
      for (float x : v) ASSERT_EQ(x, 1.0f) << s.name;
    } else if (s.name.find(".layers.") != std::string::npos) {
      linear.insert(linear.end(), v.begin(), v.end());
    }
  }
  // Normal(0, 0.02): mean within 5 standard errors, std within 1%, fourth moment (kurtosis 3)
  // within 0.1, and 68.27% inside one sigma within 0.5 points. Embedding and head separately.
  auto check = [](const std::vector<float>& v, const std::string& label) {
    const double n = static_cast<double>(v.size());
    double sum = 0, sq = 0, quad = 0, inside = 0;
    for (float x : v) {
      sum += x;
      sq += double(x) * x;
      quad += double(x) * x * x * x;
      inside += std::fabs(x) < 0.02f;
    }
    const double mean = sum / n, var = sq / n - mean * mean, std = std::sqrt(var);
    EXPECT_LT(std::fabs(mean), 5 * 0.02 / std::sqrt(n)) << label;
    EXPECT_NEAR(std, 0.02, 0.0002) << label;
    EXPECT_NEAR(quad / n / (var * var), 3.0, 0.1) << label;
    EXPECT_NEAR(inside / n, 0.6827, 0.005) << label;
    // Nothing beyond the generator's tail (u1 >= 2^-24 caps |z| at 5.77 sigma).
    for (float x : v) ASSERT_LT(std::fabs(x), 0.02f * 5.8f) << label;
  };
  check(values_of(w, "model.embed_tokens.weight"), "embedding");
  check(values_of(w, "lm_head.weight"), "lm_head");
  check(linear, "layer linears");
  // Different tensors get different streams.
  EXPECT_NE(values_of(w, "model.layers.0.mlp.gate_proj.weight"), values_of(w, "model.layers.0.mlp.up_proj.weight"));
}

TEST(InitModel, DeterministicPerSeedAndIndependentOfThreads) {
  const fs::path root = test::make_temp_dir("init_seed");
  const LlamaConfig config = preset_or_fail("tiny");
  init_model(config, root / "a", {.seed = 7, .threads = 1});
  init_model(config, root / "b", {.seed = 7, .threads = 2});
  init_model(config, root / "c", {.seed = 8});
  const std::string a = file_bytes(root / "a" / "model.safetensors");
  EXPECT_EQ(a, file_bytes(root / "b" / "model.safetensors"));
  const std::string c = file_bytes(root / "c" / "model.safetensors");
  ASSERT_EQ(a.size(), c.size());
  size_t same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += a[i] == c[i];
  EXPECT_LT(same, a.size() / 4);  // headers and norms agree; random bf16 bytes rarely do
}

TEST(InitModel, GeneratorIsIndependentOfChunking) {
  // The same elements, produced in one call or in pieces that start and end mid-pair.
  const size_t n = 100'003;
  std::vector<uint16_t> whole(n), pieces(n);
  fill_normal_bf16(5, 9, 1001, 0.02f, whole);
  size_t pos = 0, step = 1;
  while (pos < n) {
    const size_t k = std::min(n - pos, step);
    fill_normal_bf16(5, 9, 1001 + pos, 0.02f, std::span(pieces).subspan(pos, k), 1 + static_cast<int>(step % 3));
    pos += k;
    step = step * 3 + 1;
  }
  EXPECT_EQ(whole, pieces);
  std::vector<uint16_t> other_stream(n);
  fill_normal_bf16(5, 10, 1001, 0.02f, other_stream);
  EXPECT_NE(whole, other_stream);
}

TEST(InitModel, ThreefryKnownAnswers) {
  // Random123's known-answer vectors for Threefry-2x32-20: {counter, key} -> output.
  struct Case {
    uint32_t c0, c1, k0, k1, e0, e1;
  };
  for (const Case& c : {Case{0, 0, 0, 0, 0x6b200159u, 0x99ba4efeu},
                        Case{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0x1cb996fcu, 0xbb002be7u},
                        Case{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xc4923a9cu, 0x483df7a0u}}) {
    uint32_t x0 = c.c0, x1 = c.c1;
    threefry2x32_20(c.k0, c.k1, x0, x1);
    EXPECT_EQ(x0, c.e0);
    EXPECT_EQ(x1, c.e1);
  }
}

TEST(InitModel, GeneratorGoldenValues) {
  // Pins the stream: a model written by any build on any machine is the same for a seed. A change
  // here (a compiler contracting into FMA, a new formula) silently changes every benchmark model.
  // These equal the documented formula evaluated in double precision (docs/model_files.md).
  std::vector<uint16_t> v(8);
  fill_normal_bf16(0, 0, 0, 1.0f, v);
  std::vector<float> got;
  for (uint16_t b : v) got.push_back(bf16_to_float(b));
  const std::vector<float> expected = {0.0947265625f, 0.228515625f, 1.1328125f,  0.78125f,
                                        0.40234375f,   1.2109375f,   -0.0966796875f, 1.6953125f};
  EXPECT_EQ(got, expected);
}

TEST(InitModel, ShardedOutputHoldsTheSameWeights) {
  const fs::path root = test::make_temp_dir("init_shards");
  const LlamaConfig config = preset_or_fail("tiny");
  init_model(config, root / "single", {.seed = 1});
  init_model(config, root / "sharded", {.seed = 1, .max_shard_bytes = 3'000'000});
  EXPECT_TRUE(fs::exists(root / "sharded" / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(root / "sharded" / "model.safetensors"));
  ModelWeights single = ModelWeights::open(root / "single");
  ModelWeights sharded = ModelWeights::open(root / "sharded");
  EXPECT_EQ(sharded.file_count(), 3u);  // embedding 4.1 MB | layers | lm_head 4.1 MB
  for (const std::string& name : single.tensor_names()) {
    auto a = single.bytes(name), b = sharded.bytes(name);
    EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end())) << name;
  }
}

TEST(InitModel, RefusesNonEmptyDirectoryUnlessOverwrite) {
  const fs::path out = test::make_temp_dir("init_refuse");
  test::write_file(out / "precious.txt", "keep me");
  const LlamaConfig config = preset_or_fail("tiny");
  EXPECT_EQ(error_of([&] { init_model(config, out, {}); }),
            fmt::format("init-model: output directory '{}' is not empty; choose another or allow overwriting it",
                        out.string()));
  EXPECT_EQ(test::read_file(out / "precious.txt"), "keep me");

  init_model(config, out, {.overwrite = true});
  EXPECT_FALSE(fs::exists(out / "precious.txt"));
  EXPECT_TRUE(fs::exists(out / "model.safetensors"));

  const fs::path file = out / "config.json";
  EXPECT_EQ(error_of([&] { init_model(config, file, {}); }),
            fmt::format("init-model: '{}' exists and is not a directory", file.string()));
  // An existing empty directory is fine.
  const fs::path empty = test::make_temp_dir("init_empty");
  init_model(config, empty, {});
  EXPECT_TRUE(fs::exists(empty / "model.safetensors"));
}

TEST(InitModel, InterruptedRunLeavesNothing) {
  const fs::path root = test::make_temp_dir("init_interrupt");
  InitModelOptions options;
  options.max_shard_bytes = 3'000'000;
  int chunks = 0;
  options.progress = [&](uint64_t done, uint64_t total) {
    EXPECT_LE(done, total);
    if (++chunks == 2) fail("interrupted");
  };
  EXPECT_EQ(error_of([&] { init_model(preset_or_fail("tiny"), root / "m", options); }), "interrupted");
  EXPECT_TRUE(fs::is_empty(root));
}

TEST(InitModel, VocabOverrideAndBadConfig) {
  const fs::path root = test::make_temp_dir("init_vocab");
  init_model(preset_or_fail("tiny"), root / "v", {.vocab_size = 1000});
  ModelWeights w = ModelWeights::open(root / "v");
  EXPECT_EQ(w.find("model.embed_tokens.weight")->shape, (std::vector<int64_t>{1000, 64}));
  EXPECT_EQ(load_llama_config(root / "v" / "config.json").vocab_size, 1000);

  LlamaConfig bad = preset_or_fail("tiny");
  bad.num_key_value_heads = 3;
  EXPECT_EQ(error_of([&] { init_model(bad, root / "bad", {}); }),
            "init-model config: num_attention_heads (4) must be a multiple of num_key_value_heads (3)");
  EXPECT_FALSE(fs::exists(root / "bad"));
}

TEST(InitModel, CopiesAndChecksTheTokenizer) {
  FSDPQ_SHARED_DATA_OR_SKIP(tokenizer, "tokenizer.model");
  const fs::path root = test::make_temp_dir("init_tok");
  init_model(preset_or_fail("tiny"), root / "t", {.tokenizer_model = tokenizer});
  EXPECT_EQ(test::read_file(root / "t" / "tokenizer.model"), test::read_file(tokenizer));
  EXPECT_EQ(error_of([&] { init_model(preset_or_fail("tiny"), root / "small", {.tokenizer_model = tokenizer, .vocab_size = 100}); }),
            fmt::format("tokenizer '{}' has 32000 tokens but vocab_size is 100: its token ids would fall "
                        "outside the embedding; set vocab_size to at least 32000",
                        tokenizer.string()));
  EXPECT_FALSE(fs::exists(root / "small"));
}

}  // namespace
}  // namespace fsdpq
