#include "test_support.h"

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <vector>

namespace fsdpq::test {
namespace fs = std::filesystem;

namespace {
// Never destroyed: it was constructed after remove_temp_dirs was registered with atexit, so as a
// plain static it would be destroyed before that runs, and the folders would stay behind.
std::vector<fs::path>& temp_dirs() {
  static auto* dirs = new std::vector<fs::path>;
  return *dirs;
}
void remove_temp_dirs() {
  if (std::getenv("FSDPQ_KEEP_TEST_DIRS")) return;
  std::error_code ec;
  for (const auto& d : temp_dirs()) fs::remove_all(d, ec);
}
}  // namespace

fs::path make_temp_dir(const std::string& tag) {
  static std::once_flag once;
  std::call_once(once, [] { std::atexit(remove_temp_dirs); });
  std::string pattern = (fs::temp_directory_path() / ("fsdpq-" + tag + "-XXXXXX")).string();
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed for " + pattern);
  fs::path dir(buf.data());
  temp_dirs().push_back(dir);
  return dir;
}

std::optional<fs::path> shared_data_dir() {
  if (const char* env = std::getenv("FSDPQ_SHARED_DATA"); env && *env) {
    if (fs::is_directory(env)) return fs::path(env);
    return std::nullopt;
  }
  fs::path p = fs::path(FSDPQ_SOURCE_DIR) / ".." / "shared" / "data";
  if (fs::is_directory(p)) return fs::weakly_canonical(p);
  return std::nullopt;
}

void write_file(const fs::path& path, const std::string& content) {
  if (path.has_parent_path()) fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out << content;
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

CommandResult run_command(const std::string& command) {
  CommandResult result;
  std::string full = command + " 2>&1";
  FILE* pipe = popen(full.c_str(), "r");
  if (!pipe) throw std::runtime_error("popen failed: " + command);
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) result.output.append(buf.data(), n);
  int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

CommandResult run_fsdpq(const std::string& args) {
  return run_command(std::string("'") + FSDPQ_BINARY + "' " + args);
}

std::string quoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string error_message(const std::string& output) {
  const std::string prefix = "fsdpq: error: ";
  auto pos = output.find(prefix);
  if (pos == std::string::npos) return output;
  auto end = output.find('\n', pos);
  return output.substr(pos + prefix.size(), end == std::string::npos ? std::string::npos : end - pos - prefix.size());
}

}  // namespace fsdpq::test
