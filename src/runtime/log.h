// Console output. Rank 0 speaks for the job; other ranks print only when asked (verbose) or
// when they fail. Messages go to stdout, warnings and errors to stderr.
#pragma once
#include <fmt/format.h>

#include <cstdio>
#include <string>

namespace fsdpq::log {

void set_rank(int rank, int world_size);
bool is_root();
void write(std::FILE* stream, const std::string& text);

template <class... Args>
void info(fmt::format_string<Args...> f, Args&&... args) {
  if (is_root()) write(stdout, fmt::format(f, std::forward<Args>(args)...) + "\n");
}
template <class... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) {
  if (is_root()) write(stderr, "warning: " + fmt::format(f, std::forward<Args>(args)...) + "\n");
}

}  // namespace fsdpq::log
