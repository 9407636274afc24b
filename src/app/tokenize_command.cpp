// `fsdpq tokenize`: the ids (and pieces) a tokenizer gives a text, so users can check their prompts
// against Hugging Face's before training.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "app/arg_parser.h"
#include "app/commands.h"
#include "data/tokenizer.h"
#include "runtime/agreed_errors.h"
#include "runtime/exit_codes.h"
#include "runtime/log.h"
#include "util/error.h"
#include "util/strings.h"

namespace fsdpq {
namespace {

const std::vector<FlagSpec> kTokenizeFlags = {
    {"tokenizer", "PATH", "a tokenizer.model, a tokenizer.json, a model folder, or builtin:bytes", true},
    {"text", "TEXT", "the text to encode"},
    {"jsonl", "FILE", "encode the \"text\" of each line's JSON object; one {\"ids\": [...]} line out per line in"},
    {"add-bos", "", "put the BOS id first (encode alone adds no BOS or EOS, as training's data does)"},
    {"pieces", "", "also list each token as the tokenizer file writes it"},
    {"time", "", "report on stderr how long encoding took (bench/tokenizer_speed.py uses it)"},
};

struct TokenizeOptions {
  bool add_bos = false;
  bool pieces = false;
};

// Time spent in encode() alone (not reading, parsing or printing), for --time.
struct EncodeClock {
  double seconds = 0;
  size_t texts = 0, bytes = 0, tokens = 0;
};

// One output line: {"ids": [...]} and, when asked, "pieces".
void print_encoding(const data::Tokenizer& tokenizer, const std::string& text, const TokenizeOptions& o,
                    EncodeClock& clock) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<int32_t> ids = tokenizer.encode(text);
  clock.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  clock.texts += 1;
  clock.bytes += text.size();
  clock.tokens += ids.size();
  if (o.add_bos) ids.insert(ids.begin(), tokenizer.bos_id());
  nlohmann::ordered_json line = {{"ids", ids}};
  if (o.pieces) {
    std::vector<std::string> pieces;
    pieces.reserve(ids.size());
    for (int32_t id : ids) pieces.push_back(tokenizer.piece(id));
    line["pieces"] = pieces;
  }
  const std::string out = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
}

void tokenize_jsonl(const data::Tokenizer& tokenizer, const std::string& file, const TokenizeOptions& o,
                    EncodeClock& clock) {
  std::ifstream in(file, std::ios::binary);
  if (!in) fail("tokenize: cannot read --jsonl {}; expected a JSONL file of {{\"text\": \"...\"}} lines", file);
  std::string line;
  for (size_t number = 1; std::getline(in, line); ++number) {
    if (trim(line).empty()) continue;
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
    if (record.is_discarded() || !record.is_object() || !record.contains("text") || !record["text"].is_string())
      fail("{}:{}: expected a JSON object with a \"text\" string, one per line", file, number);
    print_encoding(tokenizer, record["text"].get<std::string>(), o, clock);
  }
}

void tokenize(const ParsedFlags& flags) {
  if (flags.has("text") == flags.has("jsonl"))
    fail("tokenize: give exactly one of --text TEXT and --jsonl FILE");
  const TokenizeOptions options{flags.has("add-bos"), flags.has("pieces")};
  const auto start = std::chrono::steady_clock::now();
  const std::unique_ptr<data::Tokenizer> tokenizer = data::load_tokenizer(flags.get("tokenizer"));
  const double load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EncodeClock clock;
  if (flags.has("text"))
    print_encoding(*tokenizer, flags.get("text"), options, clock);
  else
    tokenize_jsonl(*tokenizer, flags.get("jsonl"), options, clock);
  std::fflush(stdout);
  if (flags.has("time"))
    std::fprintf(stderr, "tokenize: loaded in %.3f s; encoded %zu texts (%zu bytes, %zu tokens) in %.6f s\n",
                 load_seconds, clock.texts, clock.bytes, clock.tokens, clock.seconds);
}

}  // namespace

int run_tokenize_command(const World& world, const std::vector<std::string>& args) {
  if (wants_help(args)) {
    log::info("{}", flags_help("fsdpq tokenize --tokenizer PATH (--text TEXT | --jsonl FILE) [--add-bos] [--pieces]",
                               kTokenizeFlags));
    return kExitOk;
  }
  run_on_all_ranks(world, [&] {
    if (world.size > 1) fail("fsdpq tokenize runs as one process, not under mpirun/srun with {} ranks", world.size);
    tokenize(parse_flags("tokenize", kTokenizeFlags, args));
  });
  return kExitOk;
}

}  // namespace fsdpq
