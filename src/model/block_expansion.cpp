#include "model/block_expansion.h"

#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>

#include "util/error.h"
#include "util/strings.h"

namespace fsdpq {
namespace {

// fsdp_qlora's block_expansion.py puts a copy after every original layer i with (i + 1) % split == 0,
// split = ⌊L / n⌋: that adds exactly n blocks when ⌊L / split⌋ == n (every divisor of L, and more:
// 3 on 32 layers, its default expansion_rate 0.1).
bool adds_exactly(int64_t layers, int64_t n) { return n >= 1 && n <= layers && layers / (layers / n) == n; }

std::string counts_for(int64_t layers) {
  std::vector<std::string> out;
  for (int64_t n = 1; n <= layers; ++n)
    if (adds_exactly(layers, n)) out.push_back(std::to_string(n));
  return join(out, ", ");
}

constexpr const char* kLayerPrefix = "model.layers.";

// "model.layers.12.mlp.down_proj.weight" → {12, "mlp.down_proj.weight"}; layer -1 for other tensors.
std::pair<int64_t, std::string> split_layer_name(const std::string& name) {
  if (!starts_with(name, kLayerPrefix)) return {-1, name};
  const size_t start = std::strlen(kLayerPrefix), dot = name.find('.', start);
  if (dot == std::string::npos) throw std::logic_error("split_layer_name: '" + name + "' has no module");
  return {std::stoll(name.substr(start, dot - start)), name.substr(dot + 1)};
}

// The modules that write into the residual stream: zero in a new block, so it starts as the identity.
bool writes_residual(const std::string& module) {
  return module == "self_attn.o_proj.weight" || module == "mlp.down_proj.weight";
}

}  // namespace

BlockExpansion::BlockExpansion(int64_t original_layers, int64_t new_blocks)
    : original_layers_(original_layers), new_blocks_(new_blocks) {
  if (original_layers < 1) throw std::logic_error("BlockExpansion: a model without decoder layers");
  if (new_blocks == 0) {
    group_ = original_layers;  // never reached: no layer is new
    return;
  }
  if (const std::string why = problem(original_layers, new_blocks); !why.empty())
    fail("llama_pro_num_new_blocks = {}: {}", new_blocks, why);
  group_ = original_layers / new_blocks;
}

std::string BlockExpansion::problem(int64_t original_layers, int64_t new_blocks) {
  if (new_blocks == 0 || adds_exactly(original_layers, new_blocks)) return "";
  return fmt::format("Llama-Pro puts a new block after every ⌊L / n⌋ of the model's L = {} decoder layers (fsdp_qlora's "
                     "block_expansion.py), which adds exactly n blocks for n in {}",
                     original_layers, counts_for(original_layers));
}

// The expanded model: n groups of group_ original layers and one new block, then the original
// layers left over (L − n · group_, none when n divides L).
bool BlockExpansion::is_new(int64_t layer) const {
  if (layer < 0 || layer >= layers()) throw std::logic_error("BlockExpansion::is_new: layer out of range");
  return new_blocks_ > 0 && layer < new_blocks_ * (group_ + 1) && layer % (group_ + 1) == group_;
}

int64_t BlockExpansion::source_layer(int64_t layer) const {
  if (layer < 0 || layer >= layers()) throw std::logic_error("BlockExpansion::source_layer: layer out of range");
  if (new_blocks_ == 0) return layer;
  if (layer >= new_blocks_ * (group_ + 1)) return layer - new_blocks_;  // the tail after the last new block
  const int64_t group = layer / (group_ + 1), position = layer % (group_ + 1);
  return group * group_ + std::min(position, group_ - 1);  // a new block copies the group's last layer
}

std::vector<int64_t> BlockExpansion::new_layers() const {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < layers(); ++i)
    if (is_new(i)) out.push_back(i);
  return out;
}

LlamaConfig BlockExpansion::expanded(const LlamaConfig& original) const {
  if (original.num_hidden_layers != original_layers_)
    throw std::logic_error("BlockExpansion::expanded: the config has another layer count");
  LlamaConfig c = original;
  c.num_hidden_layers = layers();
  return c;
}

WeightSource expanded_weight_source(const BlockExpansion& expansion, const LlamaConfig& original,
                                    WeightSource original_source) {
  if (expansion.new_blocks() == 0) return original_source;
  auto specs = std::make_shared<const std::vector<TensorSpec>>(hf_tensor_specs(original));
  auto index_of = std::make_shared<std::map<std::string, size_t>>();
  for (size_t i = 0; i < specs->size(); ++i) (*index_of)[(*specs)[i].name] = i;
  return [expansion, specs, index_of, source = std::move(original_source)](const TensorSpec& spec, size_t,
                                                                           int64_t first, TensorView out) {
    const auto [layer, module] = split_layer_name(spec.name);
    if (layer >= 0 && expansion.is_new(layer) && writes_residual(module)) {
      std::memset(out.data, 0, out.nbytes());  // +0.0 in every float dtype
      return;
    }
    const std::string name =
        layer < 0 ? spec.name : fmt::format("{}{}.{}", kLayerPrefix, expansion.source_layer(layer), module);
    const auto it = index_of->find(name);
    if (it == index_of->end()) throw std::logic_error("expanded_weight_source: no original tensor '" + name + "'");
    source((*specs)[it->second], it->second, first, out);
  };
}

}  // namespace fsdpq
