// The safetensors format (https://github.com/huggingface/safetensors): an 8-byte little-endian
// header length N, N bytes of JSON header, then the raw tensor bytes. Every HF model is stored so.
// Reading memory-maps the file (a 70B shard is never copied into RAM); writing streams, so a tensor
// larger than memory can be produced chunk by chunk.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "util/dtype.h"

namespace fsdpq {

// What a tensor is: enough to size and name it.
struct TensorSpec {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;

  int64_t numel() const;
  uint64_t nbytes() const;
};

// A tensor as found in a file.
struct TensorInfo : TensorSpec {
  uint64_t offset = 0;  // within the data section (after the header)
};

// The header's limit in the reference implementation: a longer one means a corrupt file.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

class SafetensorsFile {
 public:
  // Maps the file read-only and validates the whole header; throws UserError naming the file.
  static SafetensorsFile open(const std::filesystem::path& path);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  // In file order (by data offset).
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(std::string_view name) const;
  // The tensor's bytes inside the mapping (valid while this object lives).
  std::span<const std::byte> bytes(const TensorInfo& tensor) const;
  // Bytes [offset, offset + length) of the tensor: what a sharded loader reads of it. A range past
  // the tensor's end is an error naming the file and the tensor.
  std::span<const std::byte> bytes(const TensorInfo& tensor, uint64_t offset, uint64_t length) const;
  // Bytes handed out by bytes() so far (what this process read of the file, as the callers read
  // everything they ask for): the tests check that a rank reads only its shards.
  uint64_t bytes_read() const { return bytes_read_; }
  // Done with these bytes for now: their pages leave this process's resident set (they stay in
  // the page cache, shared with the other ranks, and fault back in if read again).
  void release_pages(std::span<const std::byte> bytes) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::filesystem::path& path() const { return path_; }
  uint64_t file_size() const { return size_; }

 private:
  SafetensorsFile() = default;
  void unmap();

  std::filesystem::path path_;
  const std::byte* map_ = nullptr;
  uint64_t size_ = 0;
  uint64_t data_start_ = 0;  // 8 + header length
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
  mutable uint64_t bytes_read_ = 0;
};

// Streams one safetensors file: the header goes out at construction, then exactly the declared
// bytes of the tensors, in the order given, in chunks of any size. The file is written as
// `<path>.tmp` and only renamed to `path` by finish(), so a reader never sees a partial file;
// a writer destroyed before finish() removes its temporary file.
class SafetensorsWriter {
 public:
  SafetensorsWriter(std::filesystem::path path, std::vector<TensorSpec> tensors,
                    const std::map<std::string, std::string>& metadata = {});
  SafetensorsWriter(SafetensorsWriter&& other) noexcept;
  SafetensorsWriter& operator=(SafetensorsWriter&&) = delete;
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;
  ~SafetensorsWriter();

  // Appends data; it may span tensor boundaries. More than the declared total is an error.
  void write(std::span<const std::byte> data);
  // Checks that every declared byte arrived, flushes, fsyncs and renames into place.
  void finish();

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path temporary_path() const;
  uint64_t bytes_written() const { return written_; }
  uint64_t total_bytes() const { return total_; }
  // The tensor the next byte belongs to (tensors().size() once everything arrived).
  size_t current_tensor() const;
  const std::vector<TensorSpec>& tensors() const { return tensors_; }

 private:
  void abandon() noexcept;
  void append(std::span<const std::byte> data);
  void flush_staging(bool final);

  std::filesystem::path path_;
  std::vector<TensorSpec> tensors_;
  std::vector<uint64_t> ends_;  // cumulative end offset of each tensor
  uint64_t total_ = 0;
  uint64_t written_ = 0;
  int fd_ = -1;
  bool finished_ = false;
  // Big files are written with O_DIRECT (several times faster than through the page cache here, and
  // a 140 GB model does not evict everything else): bytes gather in an aligned staging buffer that
  // goes out in whole blocks; the unaligned tail is written through the cache at the end.
  bool direct_ = false;
  std::unique_ptr<std::byte, void (*)(void*)> staging_{nullptr, nullptr};
  size_t staging_capacity_ = 0;
  size_t staged_ = 0;
};

// Writes a whole file from tensors held in memory (small files, tests).
void write_safetensors(const std::filesystem::path& path,
                       const std::vector<std::pair<TensorSpec, std::vector<std::byte>>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Writes all of `data` to `fd`, retrying short writes; errors name `path`.
void write_all(int fd, std::span<const std::byte> data, const std::filesystem::path& path);
// fsync of a directory, so that a rename inside it survives a crash.
void sync_directory(const std::filesystem::path& dir);

}  // namespace fsdpq
