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
  bool full_length_exact = true;  // false: a long text was cut before encoding, full_length is a lower bound
  bool truncated = false;
};

// fsdp_qlora's InstructionDataset.__getitem__: input = [bos] + encode(example) + [eos]; the first
// len([bos] + encode(prompt)) labels are kIgnoreIndex, even where the prompt tokenizes
// differently from the start of the example. Then cut to context_length, as its collate_fn does.
// Texts are encoded only as far as the kept tokens need (encode_leading): the ids and labels are
// those of encoding them whole, and a long text costs no more than its first few kilobytes.
Example make_example(const PromptAndExample& text, const Tokenizer& tokenizer,
                     int64_t context_length);

}  // namespace fsdpq::data
