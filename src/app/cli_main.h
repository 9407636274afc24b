// The fsdpq command line: parses argv, starts MPI, runs a subcommand, turns errors into
// one clear message and an exit code (see runtime/exit_codes.h).
#pragma once

namespace fsdpq {
int cli_main(int argc, char** argv);
}
