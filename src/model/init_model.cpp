#include "model/init_model.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "data/tokenizer.h"
#include "io/model_files.h"
#include "io/output_directory.h"
#include "io/tokenizer_files.h"
#include "util/bf16.h"
#include "util/error.h"
#include "util/strings.h"

namespace fsdpq {
namespace fs = std::filesystem;
namespace {

// Threefry-2x32 with 20 rounds (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
// SC'11; JAX's default generator): a keyed bijection of a 64-bit counter, made only of adds,
// rotations and xors, so it vectorizes.
template <int R>
inline void mix(uint32_t& x0, uint32_t& x1) {
  x0 += x1;
  x1 = (x1 << R) | (x1 >> (32 - R));
  x1 ^= x0;
}
inline void threefry2x32(uint32_t k0, uint32_t k1, uint32_t& x0, uint32_t& x1) {
  const uint32_t k2 = k0 ^ k1 ^ 0x1BD11BDAu;
  x0 += k0, x1 += k1;
  mix<13>(x0, x1), mix<15>(x0, x1), mix<26>(x0, x1), mix<6>(x0, x1);
  x0 += k1, x1 += k2 + 1;
  mix<17>(x0, x1), mix<29>(x0, x1), mix<16>(x0, x1), mix<24>(x0, x1);
  x0 += k2, x1 += k0 + 2;
  mix<13>(x0, x1), mix<15>(x0, x1), mix<26>(x0, x1), mix<6>(x0, x1);
  x0 += k0, x1 += k1 + 3;
  mix<17>(x0, x1), mix<29>(x0, x1), mix<16>(x0, x1), mix<24>(x0, x1);
  x0 += k1, x1 += k2 + 4;
  mix<13>(x0, x1), mix<15>(x0, x1), mix<26>(x0, x1), mix<6>(x0, x1);
  x0 += k2, x1 += k0 + 5;
}

// A tensor's key: the stream (tensor index) folded into the seed, as JAX's fold_in does.
struct StreamKey {
  uint32_t k0, k1;
};
StreamKey stream_key(uint64_t seed, uint64_t stream) {
  uint32_t x0 = static_cast<uint32_t>(stream), x1 = static_cast<uint32_t>(stream >> 32);
  threefry2x32(static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), x0, x1);
  return {x0, x1};
}

// Box–Muller on one counter's 2x32 bits: z0 = r cos(2 pi u2), z1 = r sin(2 pi u2) with
// r = sqrt(-2 ln u1), u1 = (hi 24 bits of x0 + 1) / 2^24 in (0, 1], u2 = (hi 24 bits of x1) / 2^24.
// log, sqrt, sin and cos are short polynomials and a Newton iteration (errors ~3e-7, far below
// bf16's 4e-3 steps) rather than libm calls, so the loop vectorizes and gives the same bits on
// every machine. Written without branches; selects are bit masks.
inline void box_muller(uint32_t x0, uint32_t x1, float scale, float& z0, float& z1) {
  // ln u1 = e ln 2 + ln m with m in [sqrt(1/2), sqrt(2)), ln m = 2 atanh(s), s = (m - 1) / (m + 1).
  const uint32_t bits = float_bits(static_cast<float>((x0 >> 8) + 1) * (1.0f / 16777216.0f));
  const uint32_t above_sqrt2 = (bits & 0x7fffffu) > 0x3504f3u;
  const int32_t e = static_cast<int32_t>(bits >> 23) - 127 + static_cast<int32_t>(above_sqrt2);
  const float m = bits_float(((bits & 0x7fffffu) | 0x3f800000u) - (above_sqrt2 << 23));
  const float s = (m - 1.0f) / (m + 1.0f);
  const float s2 = s * s;
  const float ln = static_cast<float>(e) * 0.693147180559945f +
                   2.0f * s * (1.0f + s2 * (1.0f / 3 + s2 * (1.0f / 5 + s2 * (1.0f / 7 + s2 * (1.0f / 9)))));
  // sqrt(y) = y / sqrt(y): reciprocal square root from the classic bit estimate plus three Newton steps.
  const float y = -2.0f * ln + 0.0f;  // + 0 turns -0 into +0
  float g = bits_float(0x5f3759dfu - (float_bits(y) >> 1));
  g = g * (1.5f - 0.5f * y * g * g);
  g = g * (1.5f - 0.5f * y * g * g);
  g = g * (1.5f - 0.5f * y * g * g);
  const float r = y * g * scale;
  // Angle: quadrant q from the top two bits, then phi = pi/4 + x with |x| <= pi/4 for the series.
  const uint32_t u2 = x1 >> 8, q = u2 >> 22;
  const float x = (static_cast<float>(u2 & 0x3fffffu) * (1.0f / 4194304.0f) - 0.5f) * 1.57079632679489662f;
  const float xx = x * x;
  const float sin_x = x * (1.0f + xx * (-1.0f / 6 + xx * (1.0f / 120 + xx * (-1.0f / 5040))));
  const float cos_x = 1.0f + xx * (-0.5f + xx * (1.0f / 24 + xx * (-1.0f / 720 + xx * (1.0f / 40320))));
  const uint32_t sin_phi = float_bits((sin_x + cos_x) * 0.707106781186547524f);
  const uint32_t cos_phi = float_bits((cos_x - sin_x) * 0.707106781186547524f);
  // Rotate by q quarter turns: odd q swaps sin and cos; the signs follow the quadrant.
  const uint32_t swap = 0u - (q & 1u);
  const uint32_t cos_t = ((sin_phi & swap) | (cos_phi & ~swap)) ^ (((q ^ (q >> 1)) & 1u) << 31);
  const uint32_t sin_t = ((cos_phi & swap) | (sin_phi & ~swap)) ^ ((q >> 1) << 31);
  z0 = r * bits_float(cos_t);
  z1 = r * bits_float(sin_t);
}

// Round to nearest even; the values are finite, so no NaN case.
inline uint16_t bf16_of(float f) {
  const uint32_t u = float_bits(f);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// Elements 2p and 2p+1 for pairs p in [pair0, pair0 + count), written to out[0, 2 count).
// Cloned for AVX2 (which brings no FMA, so no contraction can change a bit) and the baseline.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
__attribute__((target_clones("avx2", "default")))
#endif
void normal_pairs(StreamKey key, uint64_t pair0, int64_t count, float scale, uint16_t* out) {
  constexpr int kBatch = 64;
  for (int64_t start = 0; start < count; start += kBatch) {
    const int n = static_cast<int>(std::min<int64_t>(kBatch, count - start));
    uint16_t z0[kBatch], z1[kBatch];
    const uint64_t p0 = pair0 + static_cast<uint64_t>(start);
    for (int l = 0; l < kBatch; ++l) {  // always full width: the batch tail is discarded below
      const uint64_t p = p0 + static_cast<uint64_t>(l);
      uint32_t x0 = static_cast<uint32_t>(p), x1 = static_cast<uint32_t>(p >> 32);
      threefry2x32(key.k0, key.k1, x0, x1);
      float a, b;
      box_muller(x0, x1, scale, a, b);
      z0[l] = bf16_of(a);
      z1[l] = bf16_of(b);
    }
    uint16_t* dst = out + 2 * start;
    for (int l = 0; l < n; ++l) dst[2 * l] = z0[l], dst[2 * l + 1] = z1[l];
  }
}

// One pair, for a range that starts or ends in the middle of one.
void normal_pair(StreamKey key, uint64_t pair, float scale, uint16_t out[2]) {
  uint32_t x0 = static_cast<uint32_t>(pair), x1 = static_cast<uint32_t>(pair >> 32);
  threefry2x32(key.k0, key.k1, x0, x1);
  float a, b;
  box_muller(x0, x1, scale, a, b);
  out[0] = bf16_of(a);
  out[1] = bf16_of(b);
}

bool is_norm_weight(const std::string& name) { return ends_with(name, "norm.weight"); }

// Loads the tokenizer to ship (every kind load_tokenizer reads) and checks that its ids fit.
std::unique_ptr<data::Tokenizer> checked_tokenizer(const fs::path& tokenizer, int64_t vocab_size) {
  std::error_code ec;
  if (!fs::exists(tokenizer, ec)) fail("tokenizer '{}' does not exist", tokenizer.string());
  std::unique_ptr<data::Tokenizer> loaded = data::load_tokenizer(tokenizer.string());
  if (loaded->vocab_size() > vocab_size)
    fail("tokenizer '{}' has {} tokens but vocab_size is {}: its token ids would fall outside the "
         "embedding; set vocab_size to at least {}",
         tokenizer.string(), loaded->vocab_size(), vocab_size, loaded->vocab_size());
  return loaded;
}

}  // namespace

void threefry2x32_20(uint32_t key0, uint32_t key1, uint32_t& x0, uint32_t& x1) { threefry2x32(key0, key1, x0, x1); }

void fill_normal_bf16(uint64_t seed, uint64_t stream, uint64_t first, float stddev, std::span<uint16_t> out,
                      int threads) {
  if (out.empty()) return;
  const StreamKey key = stream_key(seed, stream);
  uint64_t begin = first, end = first + out.size();  // elements still to produce: [begin, end)
  uint16_t* dst = out.data();
  uint16_t pair[2];
  if (begin % 2) {  // starts on the second element of a pair
    normal_pair(key, begin / 2, stddev, pair);
    *dst++ = pair[1];
    ++begin;
  }
  if (end % 2 && end > begin) {  // ends on the first element of a pair
    normal_pair(key, end / 2, stddev, pair);
    out[out.size() - 1] = pair[0];
    --end;
  }
  const int64_t pairs = static_cast<int64_t>((end - begin) / 2);
  if (pairs == 0) return;
  // Pieces of whole pairs, handed to threads; which thread makes a piece cannot change its values.
  constexpr int64_t kPiece = 16384;
  const int64_t pieces = (pairs + kPiece - 1) / kPiece;
  const int nthreads = threads > 0 ? threads : omp_get_max_threads();
#pragma omp parallel for schedule(dynamic) num_threads(nthreads) if (pieces > 1)
  for (int64_t i = 0; i < pieces; ++i) {
    const int64_t count = std::min(kPiece, pairs - i * kPiece);
    normal_pairs(key, begin / 2 + static_cast<uint64_t>(i * kPiece), count, stddev, dst + 2 * i * kPiece);
  }
}

void init_model(LlamaConfig config, const fs::path& out_dir, const InitModelOptions& options) {
  if (options.vocab_size) config.vocab_size = *options.vocab_size;
  validate_llama_config(config, "init-model config");
  if (!options.tokenizer_model.empty()) {
    // generation_config.json and config.json name the tokenizer's own special tokens.
    const std::unique_ptr<data::Tokenizer> tokenizer = checked_tokenizer(options.tokenizer_model, config.vocab_size);
    config.bos_token_id = tokenizer->bos_id();
    config.eos_token_ids = {tokenizer->eos_id()};
  }
  if (options.max_shard_bytes == 0) fail("init-model: max_shard_bytes must be positive");

  const fs::path target = output_directory_target(out_dir, "init-model");
  check_output_directory_free(target, out_dir, options.overwrite, "init-model", "allow overwriting it");
  StagedDirectory staging(target, "init-model");

  const nlohmann::json hf_config = to_hf_json(config);
  write_file_atomically(staging.path() / "config.json", hf_config.dump(2) + "\n");
  const nlohmann::json generation = {{"_from_model_config", true},
                                     {"bos_token_id", hf_config["bos_token_id"]},
                                     {"eos_token_id", hf_config["eos_token_id"]}};
  write_file_atomically(staging.path() / "generation_config.json", generation.dump(2) + "\n");
  if (!options.tokenizer_model.empty()) copy_tokenizer_files(options.tokenizer_model, staging.path(), "init-model");

  const std::vector<TensorSpec> specs = hf_tensor_specs(config);
  uint64_t total = 0, done = 0;
  for (const TensorSpec& s : specs) total += s.nbytes();
  const float stddev = static_cast<float>(config.initializer_range);
  auto fill = [&](size_t tensor, uint64_t byte_offset, std::span<std::byte> chunk) {
    std::span<uint16_t> values(reinterpret_cast<uint16_t*>(chunk.data()), chunk.size() / 2);
    if (is_norm_weight(specs[tensor].name))
      std::fill(values.begin(), values.end(), float_to_bf16(1.0f));
    else
      fill_normal_bf16(options.seed, tensor, byte_offset / 2, stddev, values, options.threads);
    done += chunk.size();
    if (options.progress) options.progress(done, total);
  };
  write_model_weights(staging.path(), specs, fill, options.max_shard_bytes);

  staging.commit();
}

}  // namespace fsdpq
