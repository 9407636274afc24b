#include "data/examples.h"

#include <algorithm>

#include "util/error.h"

namespace fsdpq::data {

Example make_example(const PromptAndExample& text, const Tokenizer& tokenizer,
                     int64_t context_length) {
  if (context_length < 1)
    fail("context_length is {}; expected a positive number of tokens", context_length);
  const size_t prompt_length = 1 + tokenizer.encode(text.prompt).size();  // with BOS

  Example example;
  std::vector<int32_t> body = tokenizer.encode(text.example);
  example.input_ids.reserve(body.size() + 2);
  example.input_ids.push_back(tokenizer.bos_id());
  example.input_ids.insert(example.input_ids.end(), body.begin(), body.end());
  example.input_ids.push_back(tokenizer.eos_id());

  example.labels = example.input_ids;
  std::fill_n(example.labels.begin(), std::min(prompt_length, example.labels.size()), kIgnoreIndex);

  example.full_length = static_cast<int64_t>(example.input_ids.size());
  if (example.full_length > context_length) {
    example.truncated = true;
    example.input_ids.resize(static_cast<size_t>(context_length));
    example.labels.resize(static_cast<size_t>(context_length));
  }
  return example;
}

}  // namespace fsdpq::data
