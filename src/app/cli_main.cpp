#include "app/cli_main.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "app/arg_parser.h"
#include "app/commands.h"
#include "config/config_loader.h"
#include "config/options.h"
#include "runtime/agreed_errors.h"
#include "runtime/environment.h"
#include "runtime/exit_codes.h"
#include "runtime/host_out_of_memory.h"
#include "runtime/log.h"
#include "runtime/preemption.h"
#include "runtime/watchdog.h"
#include "runtime/world.h"
#include "util/error.h"
#include "util/strings.h"

namespace fsdpq {
namespace {

const char* kUsage = R"(fsdpq — QLoRA / LoRA / full fine-tuning of Llama-family models, sharded across MPI ranks

usage:
  fsdpq CONFIG.ini [--key value | --key=value ...]   train (or --dry_run) with a config
  fsdpq CONFIG.ini --print-config                     show the resolved config and where each value came from
  fsdpq demo [--out DIR]                              the self-contained demo (what `make run` does)
  fsdpq init-model --preset NAME --out DIR [...]      write a random-initialised model in HF layout
  fsdpq init-tokenizer --input FILE --out FILE [...]  train a small sentencepiece tokenizer
  fsdpq tokenize --tokenizer PATH --text TEXT [...]   the token ids (and pieces) of a text, or --jsonl FILE
  fsdpq merge --model DIR --adapter DIR --out DIR     fold a LoRA adapter into its base model (HF layout)
  fsdpq generate --model DIR --prompt TEXT [...]      continue a prompt (base model + optional --adapter)
  fsdpq eval CONFIG.ini [--adapter DIR]               loss and perplexity on the eval (or training) data
  fsdpq plan CONFIG.ini [--gpus N --gpu-mem GiB ...]  predict GPU / host memory; recommend a setting that fits
  fsdpq --help | --help-config | --version

Run on several GPUs / ranks with `mpirun -np N fsdpq ...` or `srun fsdpq ...` (one rank per GPU).
Every setting can be given on the command line as --key value and wins over the file.
`fsdpq COMMAND --help` describes a command's flags; `fsdpq --help-config` lists every setting.
)";

struct TrainArgs {
  std::optional<std::string> config_path;
  std::vector<ConfigOverride> overrides;
  bool print_config = false;
};

// `fsdpq [CONFIG.ini] [--key value]...`: every --key is a config setting, except --print-config.
// A repeated --key: the last one wins (as argparse, fsdp_qlora's parser, does).
TrainArgs parse_train_args(const std::vector<std::string>& args) {
  TrainArgs out;
  std::string standalone_switch;  // the bool flag just before this word, when it took no value
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    const std::string after_switch = std::exchange(standalone_switch, "");
    if (!starts_with(arg, "--")) {
      // A word after a switch that is not a bool: the config file, unless it cannot be one.
      if (!after_switch.empty() && (out.config_path || (!ends_with(arg, ".ini") && !std::filesystem::exists(arg))))
        fail("command line: '{}' follows --{}, which takes true or false (or nothing, meaning true); "
             "it is not a config file{}", arg, after_switch,
             out.config_path ? fmt::format(" either (that is '{}')", *out.config_path) : "");
      if (out.config_path)
        fail("command line: more than one config file given ('{}' and '{}')", *out.config_path, arg);
      out.config_path = arg;
      continue;
    }
    auto [key, value, has_value] = split_flag_word(arg);
    if (key == "print-config" || key == "print_config") {
      out.print_config = true;
      continue;
    }
    const OptionSpec* spec = find_option(key);
    if (!has_value) {
      // A bool switch may stand alone (`--dry_run inputs/sql.ini`): take the next word only when
      // it is a bool literal. Other keys always take the next word, but never a flag: a value
      // that starts with -- is written --key=--value.
      if (spec && spec->type == OptionType::Bool && !(i + 1 < args.size() && parse_bool(args[i + 1]).has_value())) {
        value = "true";
        standalone_switch = key;
      } else {
        const bool next_is_flag = i + 1 < args.size() && starts_with(args[i + 1], "--");
        if (!spec && (next_is_flag || i + 1 >= args.size())) {
          out.overrides.push_back({key, ""});  // resolution reports the unknown key, with a suggestion
          continue;
        }
        if (i + 1 >= args.size()) fail("command line: --{} needs a value", key);
        if (next_is_flag)
          fail("command line: --{} needs a value, but the next word is the flag {} (for a value that starts "
               "with --, write --{}=VALUE)", key, args[i + 1], key);
        value = args[++i];
      }
    }
    out.overrides.push_back({key, value});
  }
  return out;
}

int run_train(const World& world, const std::vector<std::string>& args) {
  bool print_config = false;
  ResolvedConfig resolved = resolve_train_arguments(world, args, &print_config);
  if (print_config) {
    log::info("{}", format_resolved_config(resolved));
    return kExitOk;
  }
  return run_training_job(world, resolved);
}

}  // namespace

ResolvedConfig resolve_train_arguments(const World& world, const std::vector<std::string>& args, bool* print_config) {
  ResolvedConfig resolved;
  TrainArgs train_args;
  run_on_all_ranks(world, [&] {
    train_args = parse_train_args(args);
    std::optional<std::filesystem::path> path;
    if (train_args.config_path) path = *train_args.config_path;
    resolved = resolve_config(path, train_args.overrides);
  });
  for (const auto& w : resolved.warnings) log::warn("{}", w);
  set_watchdog_timeout(resolved.config.collective_timeout_s);
  if (print_config) *print_config = train_args.print_config;
  return resolved;
}

int cli_main(int argc, char** argv) {
  // First thing: a preemption notice during start-up exits 75 (requeue), never 143 / 138.
  install_preemption_handlers();
  std::vector<std::string> args(argv + 1, argv + argc);
  // Commands that need no MPI and no files.
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::fputs(kUsage, args.empty() ? stderr : stdout);
    return args.empty() ? kExitUserError : kExitOk;
  }
  if (args[0] == "--version") {
    std::printf("fsdpq %s\n", FSDPQ_VERSION);
    return kExitOk;
  }
  if (args[0] == "--help-config") {
    std::fputs(config_reference_markdown().c_str(), stdout);
    return kExitOk;
  }

  MpiRuntime mpi(&argc, &argv);
  const World& world = mpi.world();
  log::set_rank(world.rank, world.size);
  set_preemption_rank(world.rank);
  try {
    run_on_all_ranks(world, [] { check_environment(); });
    const std::string& command = args[0];
    std::vector<std::string> rest(args.begin() + 1, args.end());
    if (command == "init-model") return run_init_model_command(world, rest);
    if (command == "init-tokenizer") return run_init_tokenizer_command(world, rest);
    if (command == "demo") return run_demo_command(world, rest);
    if (command == "merge") return run_merge_command(world, rest);
    if (command == "generate") return run_generate_command(world, rest);
    if (command == "eval") return run_eval_command(world, rest);
    if (command == "plan") return run_plan_command(world, rest);
    if (command == "tokenize") return run_tokenize_command(world, rest);
    if (command == "train") return run_train(world, rest);
    if (!starts_with(command, "--") && !ends_with(command, ".ini") && !std::filesystem::exists(command)) {
      std::string guess = closest_match(command, {"init-model", "init-tokenizer", "demo", "train", "merge", "generate", "eval", "plan", "tokenize"});
      fail("'{}' is neither a command nor a config file{}", command,
           guess.empty() ? " (fsdpq --help lists the commands)" : fmt::format(" (did you mean '{}'?)", guess));
    }
    return run_train(world, args);
  } catch (const AgreedError& e) {
    // Every rank has the same message: rank 0 prints it once.
    if (world.is_root()) {
      if (world.size > 1 && e.origin_rank != 0)
        std::fprintf(stderr, "fsdpq: error (rank %d): %s\n", e.origin_rank, e.what());
      else
        std::fprintf(stderr, "fsdpq: error: %s\n", e.what());
    }
    return e.exit_code;
  } catch (const UserError& e) {
    // Raised on this rank alone (other ranks may be waiting in a collective): end the job.
    abort_job(world, kExitUserError, e.what());
  } catch (const std::bad_alloc&) {
    abort_job(world, kExitUserError, out_of_host_memory_message());
  } catch (const std::exception& e) {
    abort_job(world, kExitInternalError, std::string("internal error: ") + e.what());
  }
}

}  // namespace fsdpq
