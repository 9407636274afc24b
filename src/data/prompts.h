// fsdp_qlora's prompt styles: how a record becomes the prompt (masked out of the loss) and the
// full example text (prompt + answer).
#pragma once
#include <string>
#include <vector>

#include "data/records.h"

namespace fsdpq::data {

enum class PromptStyle { Alpaca, Qna, QnaNoCtx, Guanaco };

// "alpaca", "qna", "qna_no_ctx", "guanaco" (fsdp_qlora's names).
std::string to_string(PromptStyle style);

// The fields a record must have for `style`. Alpaca's "input" is optional (missing = "").
std::vector<std::string> required_fields(PromptStyle style);

struct PromptAndExample {
  std::string prompt;   // the part whose tokens are masked out of the labels
  std::string example;  // prompt + answer
};

// Exactly fsdp_qlora's InstructionDataset templates. Field values are inserted literally (Python's
// str.format_map does not interpret braces inside the values). The record must have
// required_fields(style).
PromptAndExample format_record(const Record& record, PromptStyle style);

}  // namespace fsdpq::data
