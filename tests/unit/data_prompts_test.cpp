// Prompt styles: the exact strings fsdp_qlora builds.
#include <gtest/gtest.h>

#include "data/prompts.h"

namespace fsdpq::data {
namespace {

Record record(std::map<std::string, std::string> fields) {
  Record r;
  r.fields = std::move(fields);
  r.line = 1;
  return r;
}

TEST(DataPrompts, AlpacaWithInput) {
  auto out =
      format_record(record({{"instruction", "Add {a}."}, {"input", "2 + {b}"}, {"output", "4"}}),
                    PromptStyle::Alpaca);
  EXPECT_EQ(out.prompt,
            "Below is an instruction that describes a task, paired with an input that provides "
            "further context. Write a response that appropriately completes the request.\n\n"
            "### Instruction:\nAdd {a}.\n\n### Input:\n2 + {b}\n\n### Response:");
  EXPECT_EQ(out.example, out.prompt + "4");
}

TEST(DataPrompts, AlpacaWithoutInput) {
  const std::string expected =
      "Below is an instruction that describes a task. Write a response that appropriately "
      "completes the request.\n\n### Instruction:\nSay hi\n\n### Response:";
  auto empty_input = format_record(
      record({{"instruction", "Say hi"}, {"input", ""}, {"output", " hi"}}), PromptStyle::Alpaca);
  EXPECT_EQ(empty_input.prompt, expected);
  EXPECT_EQ(empty_input.example, expected + " hi");
  // ann.get("input", "") treats a missing input like an empty one.
  auto no_input =
      format_record(record({{"instruction", "Say hi"}, {"output", " hi"}}), PromptStyle::Alpaca);
  EXPECT_EQ(no_input.prompt, expected);
  // A whitespace input is not empty in Python either.
  auto space_input = format_record(
      record({{"instruction", "Say hi"}, {"input", " "}, {"output", "x"}}), PromptStyle::Alpaca);
  EXPECT_NE(space_input.prompt.find("### Input:\n \n\n"), std::string::npos);
}

TEST(DataPrompts, QnaStyles) {
  auto qna = format_record(record({{"context", "CREATE TABLE t (a INT)"},
                                   {"question", "How many?"},
                                   {"answer", "SELECT COUNT(*) FROM t"}}),
                           PromptStyle::Qna);
  EXPECT_EQ(qna.prompt,
            "###Context:\nCREATE TABLE t (a INT)\n###Question:\nHow many?\n###Answer:\n");
  EXPECT_EQ(qna.example, qna.prompt + "SELECT COUNT(*) FROM t");

  auto no_ctx =
      format_record(record({{"question", "2+2?"}, {"answer", "4"}}), PromptStyle::QnaNoCtx);
  EXPECT_EQ(no_ctx.prompt, "###Question:\n2+2?\n###Answer:\n");
  EXPECT_EQ(no_ctx.example, "###Question:\n2+2?\n###Answer:\n4");
}

TEST(DataPrompts, GuanacoSplitsOnTheFirstAssistantTurn) {
  const std::string text = "### Human: Hi### Assistant: Hello### Human: Bye### Assistant: Bye!";
  auto out = format_record(record({{"text", text}}), PromptStyle::Guanaco);
  EXPECT_EQ(out.prompt, "### Human: Hi");
  EXPECT_EQ(out.example, text);
  // No separator: the prompt is the whole text (Python's split()[0]).
  auto whole = format_record(record({{"text", "no turns here"}}), PromptStyle::Guanaco);
  EXPECT_EQ(whole.prompt, "no turns here");
  EXPECT_EQ(whole.example, "no turns here");
}

TEST(DataPrompts, RequiredFieldsAndNames) {
  EXPECT_EQ(required_fields(PromptStyle::Alpaca),
            (std::vector<std::string>{"instruction", "output"}));
  EXPECT_EQ(required_fields(PromptStyle::Qna),
            (std::vector<std::string>{"context", "question", "answer"}));
  EXPECT_EQ(required_fields(PromptStyle::QnaNoCtx),
            (std::vector<std::string>{"question", "answer"}));
  EXPECT_EQ(required_fields(PromptStyle::Guanaco), (std::vector<std::string>{"text"}));
  EXPECT_EQ(to_string(PromptStyle::QnaNoCtx), "qna_no_ctx");
}

}  // namespace
}  // namespace fsdpq::data
