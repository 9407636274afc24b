#include "train/base_fingerprint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "io/model_files.h"

namespace fsdpq {
namespace {

constexpr uint64_t kWindowBytes = 4096;

// FNV-1a, 64 bits: small, stable across platforms and versions (the digests live in checkpoints).
struct Fnv1a {
  uint64_t state = 0xcbf29ce484222325ull;
  void add(const void* data, size_t size) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < size; ++i) state = (state ^ p[i]) * 0x100000001b3ull;
  }
  void add(std::string_view s) {
    add_u64(s.size());
    add(s.data(), s.size());
  }
  void add_u64(uint64_t v) {
    unsigned char bytes[8];
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<unsigned char>(v >> (8 * i));
    add(bytes, 8);
  }
  std::string hex() const { return fmt::format("{:016x}", state); }
};

std::string tensor_digest(const TensorInfo& info, std::span<const std::byte> bytes) {
  Fnv1a h;
  h.add(dtype_name(info.dtype));
  h.add_u64(info.shape.size());
  for (int64_t d : info.shape) h.add_u64(static_cast<uint64_t>(d));
  h.add_u64(bytes.size());
  const uint64_t n = bytes.size(), w = std::min(kWindowBytes, n);
  for (uint64_t start : {uint64_t{0}, (n - w) / 2, n - w}) h.add(bytes.data() + start, w);
  return h.hex();
}

nlohmann::json weights_fingerprint(const ModelSource& model) {
  if (model.is_preset()) return {{"preset", *model.preset}};
  const ModelWeights weights = ModelWeights::open(model.directory);
  nlohmann::json tensors = nlohmann::json::object();
  for (const std::string& name : weights.tensor_names())
    tensors[name] = tensor_digest(*weights.find(name), weights.bytes(name));
  return {{"tensors", tensors}};
}

// A few lines that exercise words, digits, whitespace runs, punctuation and non-ASCII text.
constexpr std::string_view kProbeText =
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\nSELECT name, COUNT(*) FROM head WHERE age > 56 GROUP BY 1;\t  \n  12345 3.14159\n"
    "Grüße, 東京, Привет — naïve café; emoji 🦙👩‍💻 and <|special|> </s> <s>\r\n";

nlohmann::json tokenizer_fingerprint(const data::Tokenizer& tokenizer) {
  Fnv1a h;
  for (int64_t id = 0; id < tokenizer.vocab_size(); ++id) h.add(tokenizer.piece(static_cast<int32_t>(id)));
  for (int32_t id : tokenizer.encode(kProbeText)) h.add_u64(static_cast<uint32_t>(id));
  return {{"description", tokenizer.description()},
          {"vocab_size", tokenizer.vocab_size()},
          {"bos_id", tokenizer.bos_id()},
          {"eos_id", tokenizer.eos_id()},
          {"pad_id", tokenizer.pad_id()},
          {"digest", h.hex()}};
}

std::optional<std::string> weights_difference(const nlohmann::json& saved, const nlohmann::json& now) {
  auto source = [](const nlohmann::json& f) {
    return f.contains("preset") ? fmt::format("preset:{}", f.at("preset").get<std::string>())
                                : std::string("an HF model directory");
  };
  if (saved.contains("preset") || now.contains("preset")) {
    if (saved == now) return std::nullopt;
    return fmt::format("the base weights: the checkpoint was made from {}, this run uses {}", source(saved), source(now));
  }
  const nlohmann::json& a = saved.at("tensors");
  const nlohmann::json& b = now.at("tensors");
  std::map<std::string, bool> names;  // sorted, so "first" is stable
  for (auto it = a.begin(); it != a.end(); ++it) names[it.key()] = true;
  for (auto it = b.begin(); it != b.end(); ++it) names[it.key()] = true;
  size_t differing = 0;
  std::string first;
  for (const auto& [name, unused] : names) {
    const bool same = a.contains(name) && b.contains(name) && a.at(name) == b.at(name);
    if (same) continue;
    if (differing++ == 0)
      first = !a.contains(name)   ? fmt::format("'{}', which the checkpoint's model does not have", name)
              : !b.contains(name) ? fmt::format("'{}', which this run's model does not have", name)
                                  : fmt::format("'{}'", name);
  }
  if (differing == 0) return std::nullopt;
  return fmt::format("the base weights: {} of {} tensors differ (first {})", differing, names.size(), first);
}

std::optional<std::string> tokenizer_difference(const nlohmann::json& saved, const nlohmann::json& now) {
  if (saved == now) return std::nullopt;
  auto text = [](const nlohmann::json& t) {
    return fmt::format("{} (vocab {}, bos {}, eos {}, pad {}, digest {})", t.value("description", "?"),
                       t.value("vocab_size", -1), t.value("bos_id", -1), t.value("eos_id", -1), t.value("pad_id", -1),
                       t.value("digest", "?"));
  };
  // The description names the file, which may move between runs: only the behaviour counts.
  nlohmann::json a = saved, b = now;
  a.erase("description");
  b.erase("description");
  if (a == b) return std::nullopt;
  return fmt::format("the tokenizer: checkpoint {}, this run {}", text(saved), text(now));
}

}  // namespace

nlohmann::json base_fingerprint(const ModelSource& model, const data::Tokenizer& tokenizer) {
  return {{"model", weights_fingerprint(model)}, {"tokenizer", tokenizer_fingerprint(tokenizer)}};
}

std::optional<std::string> fingerprint_difference(const nlohmann::json& checkpoint, const nlohmann::json& run) {
  std::vector<std::string> differences;
  if (auto d = weights_difference(checkpoint.at("model"), run.at("model"))) differences.push_back(*d);
  if (auto d = tokenizer_difference(checkpoint.at("tokenizer"), run.at("tokenizer"))) differences.push_back(*d);
  if (differences.empty()) return std::nullopt;
  return fmt::format("{}", fmt::join(differences, "; "));
}

}  // namespace fsdpq
