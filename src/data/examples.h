// One tokenized training example: input ids and labels with the prompt masked out.
#pragma once
#include <cstdint>
#include <vector>

#include "data/prompts.h"
#include "data/tokenizer.h"

namespace fsdpq::data {

// Label value the loss ignores (PyTorch's cross-entropy ignore_index).
inline constexpr int32_t kIgnoreIndex = -100;

struct Example {
  std::vector<int32_t> input_ids;
  std::vector<int32_t> labels;  // same length as input_ids; kIgnoreIndex where not trained on
  int64_t full_length = 0;      // tokens before truncation to context_length
  bool truncated = false;
};

// fsdp_qlora's InstructionDataset.__getitem__: input = [bos] + encode(example) + [eos]; the first
// len([bos] + encode(prompt)) labels are kIgnoreIndex, even where the prompt tokenizes
// differently from the start of the example. Then cut to context_length, as its collate_fn does.
Example make_example(const PromptAndExample& text, const Tokenizer& tokenizer,
                     int64_t context_length);

}  // namespace fsdpq::data
