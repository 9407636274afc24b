// A Hugging Face model directory's weights: either one `model.safetensors`, or shards
// `model-00001-of-0000N.safetensors` listed by `model.safetensors.index.json` (its weight_map maps
// each tensor name to its shard). Reading maps the files lazily page by page, so each rank touches
// only the tensors it loads; writing streams tensors chunk by chunk and is atomic.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "io/safetensors.h"

namespace fsdpq {

inline constexpr const char* kSingleWeightsFile = "model.safetensors";
inline constexpr const char* kWeightsIndexFile = "model.safetensors.index.json";
// transformers' default max_shard_size ("5GB").
inline constexpr uint64_t kDefaultMaxShardBytes = 5'000'000'000;

class ModelWeights {
 public:
  // Opens and validates the weights of an HF model directory; throws UserError naming the
  // directory, the index file or the shard, and the tensor.
  static ModelWeights open(const std::filesystem::path& dir);

  const TensorInfo* find(std::string_view name) const;
  // The tensor's bytes (mapped, valid while this object lives); an error naming the directory
  // when the tensor is absent.
  std::span<const std::byte> bytes(std::string_view name) const;
  // Bytes [offset, offset + length) of the tensor (a sharded loader's part of it).
  std::span<const std::byte> bytes(std::string_view name, uint64_t offset, uint64_t length) const;
  // What bytes() handed out so far, over every file (SafetensorsFile::bytes_read).
  uint64_t bytes_read() const;
  // In storage order: shard by shard, by offset within each shard.
  std::vector<std::string> tensor_names() const { return names_; }
  // The file holding a tensor (an error when absent).
  const SafetensorsFile& file_of(std::string_view name) const;

  const std::filesystem::path& directory() const { return dir_; }
  bool sharded() const { return sharded_; }
  size_t file_count() const { return files_.size(); }

 private:
  struct Location {
    size_t file;
    const TensorInfo* info;
  };
  const Location& locate(std::string_view name) const;

  std::filesystem::path dir_;
  bool sharded_ = false;
  std::vector<SafetensorsFile> files_;
  std::vector<std::string> names_;
  std::unordered_map<std::string, Location> where_;
};

// Fills `out` with the bytes of tensor `tensor_index` starting at `byte_offset` within it. Each call
// stays inside one tensor, and chunks are whole elements.
using TensorChunkFiller =
    std::function<void(size_t tensor_index, uint64_t byte_offset, std::span<std::byte> out)>;

// Writes `tensors` (in that order) into `dir` as HF does: one model.safetensors when the data fits
// in max_shard_bytes, else shards of at most max_shard_bytes each (a bigger tensor gets a shard to
// itself) plus model.safetensors.index.json with metadata.total_size. Generation of the next chunk
// overlaps the writing of the previous one; at most two chunks of `chunk_bytes` are in memory.
// Files are written under temporary names and renamed at the end, the index or single file last;
// stale weight files of an earlier save in `dir` are replaced. Returns the final file names.
std::vector<std::string> write_model_weights(const std::filesystem::path& dir,
                                             const std::vector<TensorSpec>& tensors,
                                             const TensorChunkFiller& fill,
                                             uint64_t max_shard_bytes = kDefaultMaxShardBytes,
                                             uint64_t chunk_bytes = uint64_t{64} << 20);

// Writes a small text file through a temporary name and a rename, so it is never seen half written.
void write_file_atomically(const std::filesystem::path& path, std::string_view content);

// Renames a completely written staging directory to `target`. An existing target is moved aside
// first and removed only after the swap (restored if the swap fails), so a reader never finds a
// half-written directory. `what` names the command in error messages.
void swap_directory_into_place(const std::filesystem::path& staging, const std::filesystem::path& target,
                               const std::string& what);

}  // namespace fsdpq
