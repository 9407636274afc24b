#include "data/prompts.h"

#include "util/error.h"

namespace fsdpq::data {

namespace {

constexpr const char* kAlpacaHeaderWithInput =
    "Below is an instruction that describes a task, paired with an input that provides further "
    "context. Write a response that appropriately completes the request.\n\n";
constexpr const char* kAlpacaHeaderNoInput =
    "Below is an instruction that describes a task. Write a response that appropriately completes "
    "the request.\n\n";
constexpr const char* kGuanacoAssistant = "### Assistant: ";

const std::string& field(const Record& record, const std::string& name) {
  auto it = record.fields.find(name);
  if (it == record.fields.end()) fail("record on line {} has no field '{}'", record.line, name);
  return it->second;
}

}  // namespace

std::string to_string(PromptStyle style) {
  switch (style) {
    case PromptStyle::Alpaca: return "alpaca";
    case PromptStyle::Qna: return "qna";
    case PromptStyle::QnaNoCtx: return "qna_no_ctx";
    case PromptStyle::Guanaco: return "guanaco";
  }
  return "?";
}

std::vector<std::string> required_fields(PromptStyle style) {
  switch (style) {
    case PromptStyle::Alpaca: return {"instruction", "output"};
    case PromptStyle::Qna: return {"context", "question", "answer"};
    case PromptStyle::QnaNoCtx: return {"question", "answer"};
    case PromptStyle::Guanaco: return {"text"};
  }
  return {};
}

PromptAndExample format_record(const Record& record, PromptStyle style) {
  PromptAndExample out;
  switch (style) {
    case PromptStyle::Alpaca: {
      // fsdp_qlora: ann.get("input", "") == "" picks the template without an input.
      auto input = record.fields.find("input");
      bool has_input = input != record.fields.end() && !input->second.empty();
      out.prompt = has_input ? kAlpacaHeaderWithInput : kAlpacaHeaderNoInput;
      out.prompt += "### Instruction:\n" + field(record, "instruction") + "\n\n";
      if (has_input) out.prompt += "### Input:\n" + input->second + "\n\n";
      out.prompt += "### Response:";
      out.example = out.prompt + field(record, "output");
      break;
    }
    case PromptStyle::Qna:
      out.prompt = "###Context:\n" + field(record, "context") + "\n###Question:\n" +
                   field(record, "question") + "\n###Answer:\n";
      out.example = out.prompt + field(record, "answer");
      break;
    case PromptStyle::QnaNoCtx:
      out.prompt = "###Question:\n" + field(record, "question") + "\n###Answer:\n";
      out.example = out.prompt + field(record, "answer");
      break;
    case PromptStyle::Guanaco: {
      // text.split("### Assistant: ")[0]: everything before the first separator (all of it when
      // there is none).
      const std::string& text = field(record, "text");
      out.prompt = text.substr(0, text.find(kGuanacoAssistant));
      out.example = text;
      break;
    }
  }
  return out;
}

}  // namespace fsdpq::data
