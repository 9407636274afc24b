#include "io/output_directory.h"

#include <fmt/format.h>
#include <unistd.h>

#include <utility>

#include "io/model_files.h"
#include "util/error.h"

namespace fsdpq {
namespace fs = std::filesystem;

fs::path output_directory_target(const fs::path& out, const std::string& what) {
  fs::path target = fs::absolute(out).lexically_normal();
  if (!target.has_filename()) target = target.parent_path();  // "out/" → "out"
  if (target.filename().empty() || target == target.root_path())
    fail("{}: '{}' cannot be an output directory", what, out.string());
  return target;
}

void check_output_directory_free(const fs::path& target, const fs::path& out, bool overwrite, const std::string& what,
                                 const std::string& how_to_overwrite) {
  std::error_code ec;
  if (!fs::exists(target, ec)) return;
  if (!fs::is_directory(target, ec)) fail("{}: '{}' exists and is not a directory", what, out.string());
  if (!fs::is_empty(target, ec) && !overwrite)
    fail("{}: output directory '{}' is not empty; choose another or {}", what, out.string(), how_to_overwrite);
}

StagedDirectory::StagedDirectory(fs::path target, std::string what)
    : target_(std::move(target)), what_(std::move(what)) {
  const fs::path parent = target_.parent_path();
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec || !fs::is_directory(parent))
    fail("{}: cannot create '{}': {}", what_, parent.string(), ec ? ec.message() : "not a directory");
  const fs::path staging = parent / fmt::format(".{}.partial-{}", target_.filename().string(), ::getpid());
  fs::remove_all(staging, ec);
  if (!fs::create_directory(staging, ec)) fail("{}: cannot create '{}': {}", what_, staging.string(), ec.message());
  path_ = staging;  // only now is there something to remove
}

StagedDirectory::~StagedDirectory() {
  if (committed_ || path_.empty()) return;
  std::error_code ignored;
  fs::remove_all(path_, ignored);
}

void StagedDirectory::commit() {
  swap_directory_into_place(path_, target_, what_);
  committed_ = true;
}

}  // namespace fsdpq
