// PEFT's LoRA initialisation (LoraLayer.reset_lora_parameters, init_lora_weights=True):
// lora_A ~ kaiming_uniform_(a=sqrt(5)), which is U(-1/sqrt(fan_in), 1/sqrt(fan_in)), and
// lora_B = 0, so the adapter starts as an exact no-op. The random numbers come from a
// counter-based generator keyed by (seed, adapter name): every rank computes the same values for
// any element range without communicating, and a shard can initialise only its own slice.
#pragma once
#include <cstdint>
#include <string_view>

namespace fsdpq {

// 1 / sqrt(fan_in); fan_in is lora_A's input features (its weight is [rank, fan_in]).
double lora_a_bound(int64_t fan_in);

// The generator key of one adapter, e.g. name "base_model.model.model.layers.3.self_attn.q_proj".
uint64_t lora_init_key(uint64_t seed, std::string_view adapter_name);

// Element `index` (row-major in [rank, fan_in]) of lora_A: a pure function of its arguments.
float lora_a_value(uint64_t key, int64_t index, double bound);

// Fills lora_A [rank, fan_in] row-major.
void lora_init_a(float* a, int64_t rank, int64_t fan_in, uint64_t seed,
                 std::string_view adapter_name);
// Fills elements [first, first + count) of lora_A (out points at element `first`); equal to the
// same slice of lora_init_a.
void lora_init_a_range(float* out, int64_t first, int64_t count, int64_t fan_in, uint64_t seed,
                       std::string_view adapter_name);
// lora_B = 0.
void lora_init_b(float* b, int64_t numel);

}  // namespace fsdpq
