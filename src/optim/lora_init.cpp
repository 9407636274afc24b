#include "optim/lora_init.h"

#include <cmath>
#include <stdexcept>

#include "kernels/splitmix64.h"  // mix64 turns (key, counter) into uniform-looking bits

namespace fsdpq {

double lora_a_bound(int64_t fan_in) {
  if (fan_in <= 0) throw std::logic_error("lora_a_bound: fan_in must be > 0");
  // kaiming_uniform_(w, a=sqrt(5)) with fan_in mode and leaky_relu: gain = sqrt(2 / (1 + a^2))
  // = sqrt(1/3), std = gain / sqrt(fan_in), bound = sqrt(3) * std = 1 / sqrt(fan_in).
  return 1.0 / std::sqrt(static_cast<double>(fan_in));
}

uint64_t lora_init_key(uint64_t seed, std::string_view adapter_name) {
  uint64_t name_hash = 0xcbf29ce484222325ull;  // FNV-1a over the name's bytes
  for (unsigned char c : adapter_name) {
    name_hash ^= c;
    name_hash *= 0x100000001b3ull;
  }
  return mix64(mix64(seed + kGolden64) ^ name_hash);
}

float lora_a_value(uint64_t key, int64_t index, double bound) {
  const uint64_t bits = mix64(key + static_cast<uint64_t>(index + 1) * kGolden64);
  const double u = static_cast<double>(bits >> 11) * 0x1.0p-53;  // [0, 1)
  return static_cast<float>(-bound + 2.0 * bound * u);          // U(-bound, bound)
}

void lora_init_a_range(float* out, int64_t first, int64_t count, int64_t fan_in, uint64_t seed,
                       std::string_view adapter_name) {
  if (first < 0 || count < 0) throw std::logic_error("lora_init_a_range: negative range");
  const uint64_t key = lora_init_key(seed, adapter_name);
  const double bound = lora_a_bound(fan_in);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) out[i] = lora_a_value(key, first + i, bound);
}

void lora_init_a(float* a, int64_t rank, int64_t fan_in, uint64_t seed,
                 std::string_view adapter_name) {
  if (rank <= 0) throw std::logic_error("lora_init_a: rank must be > 0");
  lora_init_a_range(a, 0, rank * fan_in, fan_in, seed, adapter_name);
}

void lora_init_b(float* b, int64_t numel) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < numel; ++i) b[i] = 0.0f;
}

}  // namespace fsdpq
