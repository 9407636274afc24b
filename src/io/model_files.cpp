#include "io/model_files.h"

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <regex>

#include "util/error.h"
#include "util/strings.h"

namespace fsdpq {
namespace fs = std::filesystem;
namespace {

std::string read_text(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open '{}': {}", path.string(), std::strerror(errno));
  std::string text;
  char buf[1 << 16];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      fail("cannot read '{}': {}", path.string(), std::strerror(err));
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return text;
}

// A shard named by the index must be a plain file inside the model directory.
bool is_plain_relative(const fs::path& p) {
  if (p.empty() || p.is_absolute()) return false;
  for (const auto& part : p)
    if (part == "..") return false;
  return true;
}

std::string shard_file_name(size_t i, size_t n) { return fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, n); }

// Files an earlier save may have left that would mix with (or shadow) a new one.
bool is_weights_file(const std::string& name) {
  static const std::regex shard(R"(model-\d{5}-of-\d{5}\.safetensors)");
  return name == kSingleWeightsFile || name == kWeightsIndexFile || std::regex_match(name, shard);
}

}  // namespace

// ---- Reading -------------------------------------------------------------------------------------

ModelWeights ModelWeights::open(const fs::path& dir) {
  ModelWeights w;
  w.dir_ = dir;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail("model directory '{}' does not exist or is not a directory", dir.string());

  const fs::path single = dir / kSingleWeightsFile;
  const fs::path index_path = dir / kWeightsIndexFile;
  // Like transformers, a single model.safetensors wins over an index.
  if (fs::exists(single, ec)) {
    w.files_.push_back(SafetensorsFile::open(single));
    for (const TensorInfo& t : w.files_[0].tensors()) {
      w.names_.push_back(t.name);
      w.where_.emplace(t.name, Location{0, &t});
    }
    return w;
  }
  if (!fs::exists(index_path, ec)) {
    std::string hint;
    if (fs::exists(dir / "pytorch_model.bin", ec) || fs::exists(dir / "pytorch_model.bin.index.json", ec))
      hint = "; it holds PyTorch .bin weights, which fsdpq does not read: convert them to safetensors first";
    fail("model directory '{}': found neither {} nor {}{}", dir.string(), kSingleWeightsFile, kWeightsIndexFile, hint);
  }

  w.sharded_ = true;
  const std::string where = fmt::format("'{}'", index_path.string());
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(read_text(index_path));
  } catch (const nlohmann::json::parse_error& e) {
    fail("{}: not valid JSON (error at byte {})", where, e.byte);
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
    fail("{}: expected a JSON object with a \"weight_map\" object mapping tensor names to shard files", where);
  const nlohmann::json& weight_map = index["weight_map"];
  if (weight_map.empty()) fail("{}: weight_map is empty", where);

  // Open each shard once, in the order of its first appearance in shard-name order.
  std::map<std::string, std::vector<std::string>> tensors_by_shard;
  for (auto it = weight_map.begin(); it != weight_map.end(); ++it) {
    if (!it.value().is_string())
      fail("{}: weight_map entry '{}' must be a shard file name, found {}", where, it.key(), it.value().type_name());
    const std::string shard = it.value().get<std::string>();
    if (!is_plain_relative(shard))
      fail("{}: weight_map entry '{}' names '{}', which is not a file inside the model directory", where, it.key(), shard);
    tensors_by_shard[shard].push_back(it.key());
  }
  for (const auto& [shard, names] : tensors_by_shard) {
    const fs::path shard_path = dir / shard;
    if (!fs::is_regular_file(shard_path, ec))
      fail("{}: shard file '{}' (holding '{}') does not exist in '{}'", where, shard, names.front(), dir.string());
    w.files_.push_back(SafetensorsFile::open(shard_path));
    const size_t file_index = w.files_.size() - 1;
    const SafetensorsFile& file = w.files_.back();
    for (const std::string& name : names) {
      const TensorInfo* info = file.find(name);
      if (!info) fail("{}: tensor '{}' is mapped to '{}', but that shard does not contain it", where, name, shard);
      w.where_.emplace(name, Location{file_index, info});
    }
    // Storage order within the shard.
    for (const TensorInfo& t : file.tensors())
      if (auto it = w.where_.find(t.name); it != w.where_.end() && it->second.file == file_index)
        w.names_.push_back(t.name);
  }
  return w;
}

const ModelWeights::Location& ModelWeights::locate(std::string_view name) const {
  auto it = where_.find(std::string(name));
  if (it == where_.end()) {
    std::string guess = closest_match(name, names_);
    fail("model directory '{}' has no tensor '{}'{}", dir_.string(), name,
         guess.empty() ? "" : fmt::format(" (did you mean '{}'?)", guess));
  }
  return it->second;
}

const TensorInfo* ModelWeights::find(std::string_view name) const {
  auto it = where_.find(std::string(name));
  return it == where_.end() ? nullptr : it->second.info;
}

std::span<const std::byte> ModelWeights::bytes(std::string_view name) const {
  const Location& loc = locate(name);
  return files_[loc.file].bytes(*loc.info);
}

std::span<const std::byte> ModelWeights::bytes(std::string_view name, uint64_t offset, uint64_t length) const {
  const Location& loc = locate(name);
  return files_[loc.file].bytes(*loc.info, offset, length);
}

uint64_t ModelWeights::bytes_read() const {
  uint64_t total = 0;
  for (const SafetensorsFile& file : files_) total += file.bytes_read();
  return total;
}

const SafetensorsFile& ModelWeights::file_of(std::string_view name) const { return files_[locate(name).file]; }

// ---- Writing -------------------------------------------------------------------------------------

void write_file_atomically(const fs::path& path, std::string_view content) {
  fs::path tmp = path;
  tmp += ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot create '{}': {}", tmp.string(), std::strerror(errno));
  try {
    write_all(fd, std::as_bytes(std::span(content.data(), content.size())), tmp);
    if (::fsync(fd) != 0) fail("cannot flush '{}' to disk: {}", tmp.string(), std::strerror(errno));
  } catch (...) {
    ::close(fd);
    fs::remove(tmp);
    throw;
  }
  ::close(fd);
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    fail("cannot rename '{}' to '{}': {}", tmp.string(), path.string(), ec.message());
  }
}

namespace {

// Removes staged files unless the save completed.
struct StagedFiles {
  std::vector<fs::path> paths;
  bool committed = false;
  ~StagedFiles() {
    if (committed) return;
    std::error_code ignored;
    for (const fs::path& p : paths) fs::remove(p, ignored);
  }
};

// Greedy split in order, as transformers does: a new shard starts when the next tensor would
// overflow the current one; a tensor bigger than the limit gets a shard of its own.
std::vector<std::vector<size_t>> plan_shards(const std::vector<TensorSpec>& tensors, uint64_t max_shard_bytes) {
  std::vector<std::vector<size_t>> shards(1);
  uint64_t current = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t n = tensors[i].nbytes();
    if (!shards.back().empty() && current + n > max_shard_bytes) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().push_back(i);
    current += n;
  }
  return shards;
}

}  // namespace

std::vector<std::string> write_model_weights(const fs::path& dir, const std::vector<TensorSpec>& tensors,
                                             const TensorChunkFiller& fill, uint64_t max_shard_bytes,
                                             uint64_t chunk_bytes) {
  if (max_shard_bytes == 0) fail("write_model_weights '{}': max_shard_bytes must be positive", dir.string());
  if (tensors.empty()) fail("write_model_weights '{}': no tensors to write", dir.string());
  uint64_t largest = 0;
  for (const TensorSpec& t : tensors) largest = std::max(largest, t.nbytes());
  // Whole elements of any dtype, and no bigger than the biggest tensor needs.
  chunk_bytes = std::min(chunk_bytes, (largest + 7) / 8 * 8);
  chunk_bytes = std::max<uint64_t>(8, chunk_bytes - chunk_bytes % 8);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir))
    fail("cannot create model directory '{}': {}", dir.string(), ec ? ec.message() : "not a directory");

  const auto shards = plan_shards(tensors, max_shard_bytes);
  const bool sharded = shards.size() > 1;
  std::vector<std::string> final_names;
  for (size_t s = 0; s < shards.size(); ++s)
    final_names.push_back(sharded ? shard_file_name(s, shards.size()) : std::string(kSingleWeightsFile));

  StagedFiles staged;
  // Not value-initialised: the filler writes every byte before it is used.
  std::unique_ptr<std::byte[]> buffers[2] = {std::make_unique_for_overwrite<std::byte[]>(chunk_bytes),
                                             std::make_unique_for_overwrite<std::byte[]>(chunk_bytes)};
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};  // transformers insists on it
  nlohmann::json weight_map = nlohmann::json::object();
  uint64_t total_size = 0;

  for (size_t s = 0; s < shards.size(); ++s) {
    std::vector<TensorSpec> specs;
    for (size_t i : shards[s]) specs.push_back(tensors[i]);
    const fs::path staged_path = dir / ("." + final_names[s] + ".partial");
    staged.paths.push_back(staged_path);
    SafetensorsWriter writer(staged_path, std::move(specs), metadata);

    // Double buffering: fill one buffer while the other is being written.
    std::future<void> pending;
    int next = 0;
    for (size_t i : shards[s]) {
      const uint64_t n = tensors[i].nbytes();
      for (uint64_t offset = 0; offset < n; offset += chunk_bytes) {
        std::span<std::byte> chunk(buffers[next].get(), static_cast<size_t>(std::min(chunk_bytes, n - offset)));
        fill(i, offset, chunk);
        if (pending.valid()) pending.get();
        pending = std::async(std::launch::async, [&writer, chunk] { writer.write(chunk); });
        next ^= 1;
      }
      weight_map[tensors[i].name] = final_names[s];
      total_size += n;
    }
    if (pending.valid()) pending.get();
    writer.finish();
  }

  // Commit: first drop what an earlier save left (so old and new never mix), then rename the shards,
  // and the file that makes the directory look complete (index or single file) last.
  const fs::path index_staged = dir / ("." + std::string(kWeightsIndexFile) + ".partial");
  if (sharded) {
    nlohmann::json index = {{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}};
    staged.paths.push_back(index_staged);
    write_file_atomically(index_staged, index.dump(2) + "\n");
  }
  std::vector<fs::path> stale;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (is_weights_file(entry.path().filename().string())) stale.push_back(entry.path());
  for (const fs::path& p : stale)
    if (!fs::remove(p, ec) && ec) fail("cannot remove the earlier '{}': {}", p.string(), ec.message());
  auto move_into_place = [&](const fs::path& from, const fs::path& to) {
    fs::rename(from, to, ec);
    if (ec) fail("cannot rename '{}' to '{}': {}", from.string(), to.string(), ec.message());
  };
  for (size_t s = 0; s < shards.size(); ++s) move_into_place(staged.paths[s], dir / final_names[s]);
  if (sharded) {
    move_into_place(index_staged, dir / kWeightsIndexFile);
    final_names.push_back(kWeightsIndexFile);
  }
  staged.committed = true;
  sync_directory(dir);
  return final_names;
}

void swap_directory_into_place(const std::filesystem::path& staging, const std::filesystem::path& target,
                               const std::string& what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  auto rename_or_fail = [&](const fs::path& from, const fs::path& to) {
    fs::rename(from, to, ec);
    if (ec) fail("{}: cannot rename '{}' to '{}': {}", what, from.string(), to.string(), ec.message());
  };
  const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
  fs::path old;
  if (fs::exists(target, ec)) {
    old = parent / fmt::format(".{}.old-{}", target.filename().string(), ::getpid());
    rename_or_fail(target, old);
  }
  try {
    rename_or_fail(staging, target);
  } catch (...) {
    if (!old.empty()) fs::rename(old, target, ec);  // put the previous directory back
    throw;
  }
  sync_directory(parent);
  if (!old.empty()) fs::remove_all(old, ec);
}

}  // namespace fsdpq
