// Reads a Hugging Face tokenizer.json of the byte-level BPE kind (Llama-3 / 3.1 / 3.2, GPT-2,
// Qwen-style split patterns) into a BpeTokenizer, with the special-token names of the
// tokenizer_config.json beside it. Anything the file asks for that fsdpq cannot do exactly as
// Hugging Face does (another model type, a normalizer, dropout ...) is a UserError naming the file.
#pragma once
#include <filesystem>
#include <memory>

#include "data/bpe_tokenizer.h"

namespace fsdpq::data {

std::unique_ptr<BpeTokenizer> load_hf_tokenizer_json(const std::filesystem::path& file);

}  // namespace fsdpq::data
