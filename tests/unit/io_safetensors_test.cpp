// safetensors reading and writing, and HF model directories (single file or sharded + index).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstring>
#include <random>

#include "io/model_files.h"
#include "io/safetensors.h"
#include "test_support.h"
#include "util/error.h"

namespace fsdpq {
namespace {

namespace fs = std::filesystem;
using test::make_temp_dir;

constexpr DType kEveryDType[] = {DType::F64, DType::F32, DType::F16, DType::BF16, DType::I64, DType::I32,
                                 DType::I16, DType::I8,  DType::U8,  DType::BOOL, DType::F8_E4M3, DType::F8_E5M2};

std::vector<std::byte> random_bytes(size_t n, std::mt19937_64& rng) {
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(1 + rng() % 255);  // never zero: a lost write shows
  return out;
}

std::vector<std::byte> bytes_of(std::span<const std::byte> s) { return {s.begin(), s.end()}; }

using test::error_of;

// A file with a given header-length field, header text and data section, for corrupt headers.
fs::path write_raw(const fs::path& path, uint64_t header_len, const std::string& header, size_t data_bytes) {
  std::string content(8, '\0');
  for (int i = 0; i < 8; ++i) content[i] = static_cast<char>((header_len >> (8 * i)) & 0xff);
  content += header;
  content.append(data_bytes, '\x5a');
  test::write_file(path, content);
  return path;
}
fs::path write_header(const fs::path& path, const std::string& header, size_t data_bytes) {
  return write_raw(path, header.size(), header, data_bytes);
}

// ---- Round trips -----------------------------------------------------------------------------------

TEST(SafetensorsRoundTrip, EveryDtypeWithMetadata) {
  const fs::path dir = make_temp_dir("st_dtypes");
  std::mt19937_64 rng(11);
  std::vector<std::pair<TensorSpec, std::vector<std::byte>>> tensors;
  for (DType t : kEveryDType) {
    TensorSpec spec{"t." + std::string(dtype_name(t)), t, {static_cast<int64_t>(2 + rng() % 5), static_cast<int64_t>(1 + rng() % 7)}};
    tensors.emplace_back(spec, random_bytes(spec.nbytes(), rng));
  }
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "héllo"}};
  write_safetensors(dir / "all.safetensors", tensors, metadata);

  SafetensorsFile f = SafetensorsFile::open(dir / "all.safetensors");
  EXPECT_EQ(f.metadata(), metadata);
  ASSERT_EQ(f.tensors().size(), tensors.size());
  for (const auto& [spec, data] : tensors) {
    const TensorInfo* info = f.find(spec.name);
    ASSERT_NE(info, nullptr) << spec.name;
    EXPECT_EQ(info->dtype, spec.dtype);
    EXPECT_EQ(info->shape, spec.shape);
    EXPECT_EQ(bytes_of(f.bytes(*info)), data) << spec.name;
  }
  EXPECT_EQ(f.find("absent"), nullptr);
  // Tensors come back in file order: the order they were written.
  for (size_t i = 0; i < tensors.size(); ++i) EXPECT_EQ(f.tensors()[i].name, tensors[i].first.name);

  // The header is padded with spaces so that the data starts 8-byte aligned.
  const std::string raw = test::read_file(dir / "all.safetensors");
  uint64_t header_len = 0;
  std::memcpy(&header_len, raw.data(), 8);
  EXPECT_EQ(header_len % 8, 0u);
  EXPECT_EQ(raw.size(), 8 + header_len + [&] {
    uint64_t n = 0;
    for (const auto& [spec, data] : tensors) n += data.size();
    return n;
  }());
}

// A sharded loader reads byte ranges of a tensor; the counter says how much was handed out.
TEST(SafetensorsRead, ByteRangesOfATensorAndTheBytesReadCounter) {
  auto dir = make_temp_dir("st_range");
  std::mt19937_64 rng(7);
  const auto a = random_bytes(40, rng), b = random_bytes(24, rng);
  write_safetensors(dir / "r.safetensors", {{{"a", DType::F32, {10}}, a}, {{"b", DType::BF16, {3, 4}}, b}});
  SafetensorsFile file = SafetensorsFile::open(dir / "r.safetensors");
  EXPECT_EQ(file.bytes_read(), 0u);
  const TensorInfo& tb = *file.find("b");
  EXPECT_EQ(bytes_of(file.bytes(tb, 6, 10)), std::vector<std::byte>(b.begin() + 6, b.begin() + 16));
  EXPECT_EQ(file.bytes_read(), 10u);
  EXPECT_EQ(file.bytes(tb, 24, 0).size(), 0u);
  EXPECT_EQ(bytes_of(file.bytes(*file.find("a"))), a);
  EXPECT_EQ(file.bytes_read(), 50u);
  EXPECT_NE(error_of([&] { (void)file.bytes(tb, 20, 8); }).find("bytes [20, 28) asked of tensor 'b', which has 24 bytes"),
            std::string::npos);
  EXPECT_EQ(file.bytes_read(), 50u) << "a refused range is not counted";

  fs::rename(dir / "r.safetensors", dir / kSingleWeightsFile);
  ModelWeights weights = ModelWeights::open(dir);
  EXPECT_EQ(bytes_of(weights.bytes("a", 4, 8)), std::vector<std::byte>(a.begin() + 4, a.begin() + 12));
  EXPECT_EQ(weights.bytes_read(), 8u);
}

TEST(SafetensorsRoundTrip, ChunkedWritesAcrossTensorBoundaries) {
  const fs::path dir = make_temp_dir("st_chunks");
  std::mt19937_64 rng(12);
  std::vector<TensorSpec> specs = {{"a", DType::BF16, {33, 17}}, {"b", DType::F32, {5}}, {"empty", DType::F32, {0, 4}},
                                   {"c", DType::U8, {1001}},     {"d", DType::F64, {3, 3, 3}}};
  std::vector<std::byte> all;
  for (const auto& s : specs) {
    auto b = random_bytes(s.nbytes(), rng);
    all.insert(all.end(), b.begin(), b.end());
  }
  SafetensorsWriter writer(dir / "chunked.safetensors", specs);
  EXPECT_EQ(writer.total_bytes(), all.size());
  EXPECT_EQ(writer.current_tensor(), 0u);
  size_t pos = 0;
  while (pos < all.size()) {
    const size_t n = std::min<size_t>(all.size() - pos, 1 + rng() % 700);
    writer.write(std::span(all).subspan(pos, n));
    pos += n;
  }
  EXPECT_EQ(writer.current_tensor(), specs.size());
  EXPECT_FALSE(fs::exists(dir / "chunked.safetensors"));  // only the temporary exists until finish()
  EXPECT_TRUE(fs::exists(writer.temporary_path()));
  writer.finish();
  EXPECT_FALSE(fs::exists(writer.temporary_path()));

  SafetensorsFile f = SafetensorsFile::open(dir / "chunked.safetensors");
  std::vector<std::byte> back;
  for (const auto& s : specs) {
    auto b = f.bytes(*f.find(s.name));
    EXPECT_EQ(b.size(), s.nbytes());
    back.insert(back.end(), b.begin(), b.end());
  }
  EXPECT_EQ(back, all);
  EXPECT_EQ(f.find("empty")->shape, (std::vector<int64_t>{0, 4}));
}

TEST(SafetensorsRoundTrip, LargeFileThroughDirectIo) {
  // Over 64 MiB, the writer switches to O_DIRECT with a page-cache tail; an odd size tests the tail.
  const fs::path dir = make_temp_dir("st_large");
  std::vector<TensorSpec> specs = {{"big", DType::BF16, {4099, 8193}}, {"tail", DType::U8, {12345}}};
  auto pattern = [](uint64_t i) { return static_cast<std::byte>((i * 2654435761u >> 13) | 1u); };
  SafetensorsWriter writer(dir / "large.safetensors", specs);
  std::vector<std::byte> chunk(3'000'001);
  uint64_t written = 0;
  while (written < writer.total_bytes()) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk.size(), writer.total_bytes() - written));
    for (size_t k = 0; k < n; ++k) chunk[k] = pattern(written + k);
    writer.write(std::span(chunk).first(n));
    written += n;
  }
  writer.finish();
  SafetensorsFile f = SafetensorsFile::open(dir / "large.safetensors");
  uint64_t i = 0, mismatches = 0;
  for (const auto& s : specs)
    for (std::byte b : f.bytes(*f.find(s.name))) mismatches += b != pattern(i++);
  EXPECT_EQ(i, written);
  EXPECT_EQ(mismatches, 0u);
}

TEST(SafetensorsRoundTrip, MatchesReferenceBytes) {
  // What the reference implementation writes for {"a": float32 [1.0, 2.0]}, with and without metadata.
  const fs::path dir = make_temp_dir("st_golden");
  std::vector<std::byte> data(8);
  const float values[2] = {1.0f, 2.0f};
  std::memcpy(data.data(), values, 8);
  write_safetensors(dir / "a.safetensors", {{TensorSpec{"a", DType::F32, {2}}, data}});
  std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string expected(8, '\0');
  expected[0] = static_cast<char>(header.size());
  expected += header + std::string(reinterpret_cast<const char*>(data.data()), 8);
  EXPECT_EQ(test::read_file(dir / "a.safetensors"), expected);

  write_safetensors(dir / "m.safetensors", {{TensorSpec{"a", DType::F32, {2}}, data}}, {{"format", "pt"}});
  const std::string raw = test::read_file(dir / "m.safetensors");
  const std::string with_metadata = R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_EQ(raw.substr(8, with_metadata.size()), with_metadata);
  EXPECT_EQ(static_cast<size_t>(raw[0]), (with_metadata.size() + 7) / 8 * 8);
}

// ---- Writer misuse -----------------------------------------------------------------------------------

TEST(SafetensorsWriter, RejectsExtraBytes) {
  const fs::path dir = make_temp_dir("st_extra");
  const fs::path path = dir / "x.safetensors";
  SafetensorsWriter w(path, {{"a", DType::F32, {2}}});
  std::vector<std::byte> ten(10, std::byte{7});
  EXPECT_EQ(error_of([&] { w.write(ten); }),
            fmt::format("safetensors writer for '{}': received 2 bytes more than the 8 bytes declared for its tensors",
                        path.string()));
}

TEST(SafetensorsWriter, RejectsIncompleteFinishAndCleansUp) {
  const fs::path dir = make_temp_dir("st_short");
  const fs::path path = dir / "x.safetensors";
  {
    SafetensorsWriter w(path, {{"a", DType::F32, {2}}, {"b", DType::I16, {3}}});
    std::vector<std::byte> some(10, std::byte{7});
    w.write(some);
    EXPECT_EQ(error_of([&] { w.finish(); }),
              fmt::format("safetensors writer for '{}': finished after 10 of 14 bytes; tensor 'b' got 2 of its 6 bytes",
                          path.string()));
    EXPECT_TRUE(fs::exists(w.temporary_path()));
  }
  // Destroyed without a successful finish(): nothing is left behind.
  EXPECT_FALSE(fs::exists(path));
  EXPECT_TRUE(fs::is_empty(dir));
}

TEST(SafetensorsWriter, RejectsDuplicateAndReservedNames) {
  const fs::path dir = make_temp_dir("st_names");
  const fs::path path = dir / "x.safetensors";
  EXPECT_EQ(error_of([&] { SafetensorsWriter(path, {{"a", DType::F32, {1}}, {"a", DType::F32, {1}}}); }),
            fmt::format("safetensors writer for '{}': tensor 'a' is declared twice", path.string()));
  EXPECT_EQ(error_of([&] { SafetensorsWriter(path, {{"__metadata__", DType::F32, {1}}}); }),
            fmt::format("safetensors writer for '{}': '__metadata__' cannot be a tensor name", path.string()));
  EXPECT_EQ(error_of([&] { SafetensorsWriter(path, {{"neg", DType::F32, {2, -1}}}); }),
            fmt::format("safetensors writer for '{}': tensor 'neg' has an invalid shape [2, -1]", path.string()));
  EXPECT_TRUE(fs::is_empty(dir));
}

// ---- Corrupt files ---------------------------------------------------------------------------------

struct CorruptCase {
  std::string label;
  std::string header;   // JSON text written with its true length
  size_t data_bytes;
  std::string message;  // after "safetensors file '<path>': "
};

TEST(SafetensorsCorrupt, CatalogueOfBadHeaders) {
  const fs::path dir = make_temp_dir("st_corrupt");
  const std::string all_dtypes = "F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL, F8_E4M3, F8_E5M2";
  const std::vector<CorruptCase> cases = {
      {"invalid_json", "{nope}", 0, "header is not valid JSON (error at byte 3 of the header)"},
      {"truncated_json", R"({"a": )", 0, "header is not valid JSON (error at byte 7 of the header)"},
      {"array", "[1,2]", 0, "header must be a JSON object, found array"},
      {"entry_not_object", R"({"w":[1]})", 0, "tensor 'w' must be an object with dtype, shape and data_offsets"},
      {"unknown_dtype", R"({"w":{"dtype":"F12","shape":[2],"data_offsets":[0,4]}})", 4,
       "tensor 'w' has unknown dtype 'F12' (expected one of " + all_dtypes + ")"},
      {"missing_dtype", R"({"w":{"shape":[2],"data_offsets":[0,4]}})", 4,
       "tensor 'w' has no dtype string (expected one of " + all_dtypes + ")"},
      {"negative_dim", R"({"w":{"dtype":"U8","shape":[-2],"data_offsets":[0,2]}})", 2,
       "tensor 'w': shape must be a list of non-negative integers"},
      {"float_dim", R"({"w":{"dtype":"U8","shape":[2.5],"data_offsets":[0,2]}})", 2,
       "tensor 'w': shape must be a list of non-negative integers"},
      {"shape_not_list", R"({"w":{"dtype":"U8","shape":2,"data_offsets":[0,2]}})", 2,
       "tensor 'w': shape must be a list of non-negative integers"},
      {"huge_shape", R"({"w":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,2]}})", 2,
       "tensor 'w': shape [4294967296, 4294967296] has too many elements"},
      {"three_offsets", R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,1,2]}})", 2,
       "tensor 'w': data_offsets must be two integers [begin, end] with begin <= end"},
      {"reversed_offsets", R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[2,0]}})", 2,
       "tensor 'w': data_offsets must be two integers [begin, end] with begin <= end"},
      {"string_offsets", R"({"w":{"dtype":"U8","shape":[2],"data_offsets":["0","2"]}})", 2,
       "tensor 'w': data_offsets must be two integers [begin, end] with begin <= end"},
      {"past_end", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8,
       "tensor 'w' ends at byte 16 of the data section, past its end (8 bytes); the file is truncated"},
      {"size_mismatch", R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8,
       "tensor 'w' has 8 bytes but its shape [3] of F32 needs 12"},
      {"overlap",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       12, "tensors 'a' and 'b' overlap in the data section"},
      {"metadata_not_string", R"({"__metadata__":{"format":1}})", 0,
       "__metadata__ key 'format' must have a string value, found number"},
      {"metadata_not_object", R"({"__metadata__":"pt"})", 0, "__metadata__ must be an object of strings, found string"},
  };
  for (const CorruptCase& c : cases) {
    const fs::path p = write_header(dir / (c.label + ".safetensors"), c.header, c.data_bytes);
    EXPECT_EQ(error_of([&] { SafetensorsFile::open(p); }), fmt::format("safetensors file '{}': {}", p.string(), c.message))
        << c.label;
  }
}

TEST(SafetensorsCorrupt, BadLengthsAndFiles) {
  const fs::path dir = make_temp_dir("st_lengths");
  const fs::path tiny = dir / "tiny.safetensors";
  test::write_file(tiny, "12345");
  EXPECT_EQ(error_of([&] { SafetensorsFile::open(tiny); }),
            fmt::format("safetensors file '{}': only 5 bytes long; a safetensors file starts with an 8-byte header length",
                        tiny.string()));

  const fs::path absurd = write_raw(dir / "absurd.safetensors", 200'000'000, "{}", 0);
  EXPECT_EQ(error_of([&] { SafetensorsFile::open(absurd); }),
            fmt::format("safetensors file '{}': header length 200000000 is larger than the 100000000-byte limit; the "
                        "file is corrupt or not a safetensors file",
                        absurd.string()));

  const fs::path longer = write_raw(dir / "longer.safetensors", 1000, "{}", 90);  // 100 bytes in all
  EXPECT_EQ(error_of([&] { SafetensorsFile::open(longer); }),
            fmt::format("safetensors file '{}': header length 1000 runs past the end of the file (100 bytes); the file "
                        "is truncated or not a safetensors file",
                        longer.string()));

  const fs::path missing = dir / "missing.safetensors";
  EXPECT_EQ(error_of([&] { SafetensorsFile::open(missing); }),
            fmt::format("safetensors file '{}': cannot open it: No such file or directory", missing.string()));
  EXPECT_EQ(error_of([&] { SafetensorsFile::open(dir); }),
            fmt::format("safetensors file '{}': not a regular file", dir.string()));

  // An empty header is a valid file without tensors.
  const fs::path empty = write_header(dir / "empty.safetensors", "{}", 0);
  EXPECT_TRUE(SafetensorsFile::open(empty).tensors().empty());
}

// ---- Model directories -------------------------------------------------------------------------------

// Deterministic content for tensor i at byte offset o, independent of chunking.
std::byte content_byte(size_t tensor, uint64_t offset) {
  return static_cast<std::byte>(((tensor + 1) * 131 + offset * 2654435761u) >> 7 | 1u);
}
const TensorChunkFiller kContent = [](size_t tensor, uint64_t offset, std::span<std::byte> out) {
  for (size_t k = 0; k < out.size(); ++k) out[k] = content_byte(tensor, offset + k);
};

std::vector<TensorSpec> small_model_specs() {
  return {{"model.embed_tokens.weight", DType::BF16, {100, 16}},  // 3200 bytes
          {"model.layers.0.self_attn.q_proj.weight", DType::BF16, {16, 16}},  // 512
          {"model.layers.0.mlp.up_proj.weight", DType::BF16, {40, 16}},  // 1280
          {"model.layers.0.input_layernorm.weight", DType::F32, {16}},  // 64
          {"model.norm.weight", DType::BF16, {16}},  // 32
          {"lm_head.weight", DType::BF16, {100, 16}}};  // 3200
}

void expect_content(const ModelWeights& w, const std::vector<TensorSpec>& specs) {
  for (size_t i = 0; i < specs.size(); ++i) {
    auto b = w.bytes(specs[i].name);
    ASSERT_EQ(b.size(), specs[i].nbytes()) << specs[i].name;
    uint64_t bad = 0;
    for (size_t k = 0; k < b.size(); ++k) bad += b[k] != content_byte(i, k);
    EXPECT_EQ(bad, 0u) << specs[i].name;
  }
}

TEST(ModelFiles, ShardedRoundTrip) {
  const fs::path dir = make_temp_dir("mf_sharded");
  const auto specs = small_model_specs();
  // 4000-byte shards: [embed 3200, q 512] [up 1280, norm 64, norm 32] [lm_head 3200]; chunks of 1000.
  auto files = write_model_weights(dir, specs, kContent, 4000, 1000);
  EXPECT_EQ(files, (std::vector<std::string>{"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                                             "model-00003-of-00003.safetensors", "model.safetensors.index.json"}));
  std::vector<std::string> listed;
  for (const auto& e : fs::directory_iterator(dir)) listed.push_back(e.path().filename().string());
  std::sort(listed.begin(), listed.end());
  EXPECT_EQ(listed, files);  // nothing temporary left

  const auto index = nlohmann::json::parse(test::read_file(dir / "model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"], 3200 + 512 + 1280 + 64 + 32 + 3200);
  EXPECT_EQ(index["weight_map"]["model.embed_tokens.weight"], "model-00001-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["model.norm.weight"], "model-00002-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["lm_head.weight"], "model-00003-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"].size(), specs.size());

  ModelWeights w = ModelWeights::open(dir);
  EXPECT_TRUE(w.sharded());
  EXPECT_EQ(w.file_count(), 3u);
  std::vector<std::string> names;
  for (const auto& s : specs) names.push_back(s.name);
  EXPECT_EQ(w.tensor_names(), names);  // storage order
  expect_content(w, specs);
  EXPECT_EQ(w.find("model.layers.0.input_layernorm.weight")->dtype, DType::F32);
  EXPECT_EQ(w.file_of("lm_head.weight").path(), dir / "model-00003-of-00003.safetensors");
  EXPECT_EQ(w.file_of("lm_head.weight").metadata().at("format"), "pt");
}

TEST(ModelFiles, SingleFileWhenItFitsAndStaleFilesReplaced) {
  const fs::path dir = make_temp_dir("mf_single");
  const auto specs = small_model_specs();
  write_model_weights(dir, specs, kContent, 4000, 1000);  // sharded first
  test::write_file(dir / "config.json", "{}");              // not a weights file: must survive
  auto files = write_model_weights(dir, specs, kContent, kDefaultMaxShardBytes, 777);
  EXPECT_EQ(files, (std::vector<std::string>{"model.safetensors"}));
  EXPECT_FALSE(fs::exists(dir / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(dir / "model-00001-of-00003.safetensors"));
  EXPECT_TRUE(fs::exists(dir / "config.json"));
  ModelWeights w = ModelWeights::open(dir);
  EXPECT_FALSE(w.sharded());
  expect_content(w, specs);
}

TEST(ModelFiles, FailedWriteLeavesNothing) {
  const fs::path dir = make_temp_dir("mf_fail");
  size_t calls = 0;
  TensorChunkFiller failing = [&](size_t t, uint64_t o, std::span<std::byte> out) {
    if (++calls == 5) fail("generator broke");
    kContent(t, o, out);
  };
  EXPECT_EQ(error_of([&] { write_model_weights(dir, small_model_specs(), failing, 4000, 1000); }), "generator broke");
  EXPECT_TRUE(fs::is_empty(dir));
}

TEST(ModelFiles, MissingTensorNamesTheDirectory) {
  const fs::path dir = make_temp_dir("mf_absent");
  write_model_weights(dir, small_model_specs(), kContent);
  ModelWeights w = ModelWeights::open(dir);
  EXPECT_EQ(w.find("model.norm.weights"), nullptr);
  EXPECT_EQ(error_of([&] { w.bytes("model.norm.weights"); }),
            fmt::format("model directory '{}' has no tensor 'model.norm.weights' (did you mean 'model.norm.weight'?)",
                        dir.string()));
}

TEST(ModelFiles, IndexErrors) {
  const fs::path root = make_temp_dir("mf_index");
  auto sharded_dir = [&](const std::string& name) {
    const fs::path d = root / name;
    write_model_weights(d, small_model_specs(), kContent, 4000);
    return d;
  };
  {  // malformed JSON
    const fs::path d = sharded_dir("malformed");
    test::write_file(d / "model.safetensors.index.json", R"({"weight_map": {"a": )");
    EXPECT_EQ(error_of([&] { ModelWeights::open(d); }),
              fmt::format("'{}': not valid JSON (error at byte 22)", (d / "model.safetensors.index.json").string()));
  }
  {  // no weight_map
    const fs::path d = sharded_dir("no_map");
    test::write_file(d / "model.safetensors.index.json", R"({"metadata": {}})");
    EXPECT_EQ(error_of([&] { ModelWeights::open(d); }),
              fmt::format("'{}': expected a JSON object with a \"weight_map\" object mapping tensor names to shard files",
                          (d / "model.safetensors.index.json").string()));
  }
  {  // a shard file is missing
    const fs::path d = sharded_dir("missing_shard");
    fs::remove(d / "model-00002-of-00003.safetensors");
    EXPECT_EQ(error_of([&] { ModelWeights::open(d); }),
              fmt::format("'{}': shard file 'model-00002-of-00003.safetensors' (holding "
                          "'model.layers.0.input_layernorm.weight') does not exist in '{}'",
                          (d / "model.safetensors.index.json").string(), d.string()));
  }
  {  // a tensor mapped to a shard that lacks it
    const fs::path d = sharded_dir("wrong_shard");
    auto index = nlohmann::json::parse(test::read_file(d / "model.safetensors.index.json"));
    index["weight_map"]["lm_head.weight"] = "model-00001-of-00003.safetensors";
    test::write_file(d / "model.safetensors.index.json", index.dump());
    EXPECT_EQ(error_of([&] { ModelWeights::open(d); }),
              fmt::format("'{}': tensor 'lm_head.weight' is mapped to 'model-00001-of-00003.safetensors', but that "
                          "shard does not contain it",
                          (d / "model.safetensors.index.json").string()));
  }
  {  // a shard name that escapes the directory
    const fs::path d = sharded_dir("escape");
    auto index = nlohmann::json::parse(test::read_file(d / "model.safetensors.index.json"));
    index["weight_map"]["lm_head.weight"] = "../elsewhere.safetensors";
    test::write_file(d / "model.safetensors.index.json", index.dump());
    EXPECT_EQ(error_of([&] { ModelWeights::open(d); }),
              fmt::format("'{}': weight_map entry 'lm_head.weight' names '../elsewhere.safetensors', which is not a file "
                          "inside the model directory",
                          (d / "model.safetensors.index.json").string()));
  }
  {  // no weights at all, but PyTorch .bin files
    const fs::path d = root / "bin_only";
    fs::create_directories(d);
    test::write_file(d / "pytorch_model.bin", "x");
    EXPECT_EQ(error_of([&] { ModelWeights::open(d); }),
              fmt::format("model directory '{}': found neither model.safetensors nor model.safetensors.index.json; it "
                          "holds PyTorch .bin weights, which fsdpq does not read: convert them to safetensors first",
                          d.string()));
  }
  EXPECT_EQ(error_of([&] { ModelWeights::open(root / "nowhere"); }),
            fmt::format("model directory '{}' does not exist or is not a directory", (root / "nowhere").string()));
}

}  // namespace
}  // namespace fsdpq
