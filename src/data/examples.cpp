#include "data/examples.h"

#include <algorithm>

#include "data/leading_tokens.h"
#include "util/error.h"

namespace fsdpq::data {

Example make_example(const PromptAndExample& text, const Tokenizer& tokenizer,
                     int64_t context_length) {
  if (context_length < 1)
    fail("context_length is {}; expected a positive number of tokens", context_length);
  // BOS takes the first position: context_length - 1 tokens of a text are all that can be kept.
  // A prompt cut short has at least that many tokens, so it masks everything that is kept.
  const auto kept_tokens = static_cast<size_t>(context_length - 1);
  const size_t prompt_length = 1 + encode_leading(tokenizer, text.prompt, kept_tokens).ids.size();  // with BOS

  Example example;
  const LeadingTokens body = encode_leading(tokenizer, text.example, kept_tokens);
  example.input_ids.reserve(body.ids.size() + 2);
  example.input_ids.push_back(tokenizer.bos_id());
  example.input_ids.insert(example.input_ids.end(), body.ids.begin(), body.ids.end());
  // A body cut short keeps at least context_length - 1 ids: this EOS is always cut off below.
  example.input_ids.push_back(tokenizer.eos_id());

  example.labels = example.input_ids;
  std::fill_n(example.labels.begin(), std::min(prompt_length, example.labels.size()), kIgnoreIndex);

  example.full_length = static_cast<int64_t>(example.input_ids.size());
  example.full_length_exact = body.complete;
  if (example.full_length > context_length) {
    example.truncated = true;
    example.input_ids.resize(static_cast<size_t>(context_length));
    example.labels.resize(static_cast<size_t>(context_length));
  }
  return example;
}

}  // namespace fsdpq::data
