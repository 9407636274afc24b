#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <tuple>
#include <cerrno>
#include <cstring>
#include <limits>

#include "runtime/watchdog.h"
#include "util/error.h"
#include "util/shape_text.h"
#include "util/strings.h"

namespace fsdpq {
namespace {

constexpr DType kAllDTypes[] = {DType::F64, DType::F32, DType::F16, DType::BF16, DType::I64, DType::I32,
                                DType::I16, DType::I8,  DType::U8,  DType::BOOL, DType::F8_E4M3, DType::F8_E5M2};

std::string dtype_list() {
  std::vector<std::string> names;
  for (DType t : kAllDTypes) names.emplace_back(dtype_name(t));
  return join(names, ", ");
}


// A JSON value as a non-negative integer that fits in int64, or nullopt.
std::optional<int64_t> json_non_negative(const nlohmann::json& v) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) {
    int64_t i = v.get<int64_t>();
    if (i < 0) return std::nullopt;
    return i;
  }
  return std::nullopt;
}

uint64_t read_le64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

void put_le64(std::byte* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xffu);
}

// O_DIRECT wants block-aligned buffers, offsets and sizes; 4096 satisfies every common device.
constexpr size_t kBlock = 4096;
constexpr size_t kStagingBytes = size_t{16} << 20;
constexpr uint64_t kDirectMinBytes = uint64_t{64} << 20;  // small files gain nothing from it

}  // namespace

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

uint64_t TensorSpec::nbytes() const { return static_cast<uint64_t>(numel()) * dtype_size(dtype); }

// ---- Reading -------------------------------------------------------------------------------------

namespace {

// The file mapped read-only; UserError naming it (`where`) when it cannot be, or is too short to
// hold a header length.
std::pair<const std::byte*, uint64_t> map_file(const std::filesystem::path& path, const std::string& where) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot open it: {}", where, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    fail("{}: cannot read its size: {}", where, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("{}: not a regular file", where);
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    fail("{}: only {} bytes long; a safetensors file starts with an 8-byte header length", where, size);
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int map_errno = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (map == MAP_FAILED) fail("{}: cannot memory-map it: {}", where, std::strerror(map_errno));
  return {static_cast<const std::byte*>(map), size};
}

// One header entry (not __metadata__), checked against the data section's `data_size` bytes.
TensorInfo read_tensor_entry(const std::string& name, const nlohmann::json& entry, uint64_t data_size,
                             const std::string& where) {
  if (!entry.is_object()) fail("{}: tensor '{}' must be an object with dtype, shape and data_offsets", where, name);
  TensorInfo info;
  info.name = name;
  auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end() || !dtype_it->is_string())
    fail("{}: tensor '{}' has no dtype string (expected one of {})", where, name, dtype_list());
  auto dtype = dtype_from_name(dtype_it->get<std::string>());
  if (!dtype)
    fail("{}: tensor '{}' has unknown dtype '{}' (expected one of {})", where, name, dtype_it->get<std::string>(),
         dtype_list());
  info.dtype = *dtype;

  auto shape_it = entry.find("shape");
  if (shape_it == entry.end() || !shape_it->is_array())
    fail("{}: tensor '{}': shape must be a list of non-negative integers", where, name);
  for (const auto& d : *shape_it) {
    auto dim = json_non_negative(d);
    if (!dim) fail("{}: tensor '{}': shape must be a list of non-negative integers", where, name);
    info.shape.push_back(*dim);
  }
  auto numel = checked_numel(info.shape);
  if (!numel || *numel > std::numeric_limits<int64_t>::max() / 8)
    fail("{}: tensor '{}': shape {} has too many elements", where, name, shape_text(info.shape));

  auto offsets_it = entry.find("data_offsets");
  std::optional<int64_t> begin, end;
  if (offsets_it != entry.end() && offsets_it->is_array() && offsets_it->size() == 2) {
    begin = json_non_negative((*offsets_it)[0]);
    end = json_non_negative((*offsets_it)[1]);
  }
  if (!begin || !end || *begin > *end)
    fail("{}: tensor '{}': data_offsets must be two integers [begin, end] with begin <= end", where, name);
  if (static_cast<uint64_t>(*end) > data_size)
    fail("{}: tensor '{}' ends at byte {} of the data section, past its end ({} bytes); the file is "
         "truncated",
         where, name, *end, data_size);
  const uint64_t expected = static_cast<uint64_t>(*numel) * dtype_size(info.dtype);
  const uint64_t actual = static_cast<uint64_t>(*end - *begin);
  if (actual != expected)
    fail("{}: tensor '{}' has {} bytes but its shape {} of {} needs {}", where, name, actual, shape_text(info.shape),
         dtype_name(info.dtype), expected);
  info.offset = static_cast<uint64_t>(*begin);
  return info;
}

// Sorted by start, two non-empty tensors overlap exactly when one starts before the previous ends.
void check_no_overlap(const std::vector<TensorInfo>& sorted, const std::string& where) {
  const TensorInfo* previous = nullptr;
  for (const TensorInfo& t : sorted) {
    if (t.nbytes() == 0) continue;
    if (previous && t.offset < previous->offset + previous->nbytes())
      fail("{}: tensors '{}' and '{}' overlap in the data section", where, previous->name, t.name);
    previous = &t;
  }
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  SafetensorsFile file;
  file.path_ = path;
  const std::string where = fmt::format("safetensors file '{}'", path.string());
  std::tie(file.map_, file.size_) = map_file(path, where);

  const uint64_t header_len = read_le64(file.map_);
  if (header_len > kMaxSafetensorsHeaderBytes)
    fail("{}: header length {} is larger than the {}-byte limit; the file is corrupt or not a "
         "safetensors file",
         where, header_len, kMaxSafetensorsHeaderBytes);
  if (header_len > file.size_ - 8)
    fail("{}: header length {} runs past the end of the file ({} bytes); the file is truncated or "
         "not a safetensors file",
         where, header_len, file.size_);
  file.data_start_ = 8 + header_len;
  const uint64_t data_size = file.size_ - file.data_start_;

  const char* header_begin = reinterpret_cast<const char*>(file.map_ + 8);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(header_begin, header_begin + header_len);
  } catch (const nlohmann::json::parse_error& e) {
    fail("{}: header is not valid JSON (error at byte {} of the header)", where, e.byte);
  }
  if (!header.is_object()) fail("{}: header must be a JSON object, found {}", where, header.type_name());

  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() != "__metadata__") {
      file.tensors_.push_back(read_tensor_entry(it.key(), it.value(), data_size, where));
      continue;
    }
    const nlohmann::json& entry = it.value();
    if (!entry.is_object()) fail("{}: __metadata__ must be an object of strings, found {}", where, entry.type_name());
    for (auto m = entry.begin(); m != entry.end(); ++m) {
      if (!m.value().is_string())
        fail("{}: __metadata__ key '{}' must have a string value, found {}", where, m.key(), m.value().type_name());
      file.metadata_[m.key()] = m.value().get<std::string>();
    }
  }

  std::sort(file.tensors_.begin(), file.tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.name < b.name;
  });
  check_no_overlap(file.tensors_, where);
  for (size_t i = 0; i < file.tensors_.size(); ++i) file.index_.emplace(file.tensors_[i].name, i);
  return file;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept { *this = std::move(other); }

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    size_ = std::exchange(other.size_, 0);
    data_start_ = std::exchange(other.data_start_, 0);
    tensors_ = std::move(other.tensors_);
    index_ = std::move(other.index_);
    metadata_ = std::move(other.metadata_);
    bytes_read_ = std::exchange(other.bytes_read_, 0);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() { unmap(); }

void SafetensorsFile::unmap() {
  if (map_) ::munmap(const_cast<std::byte*>(map_), size_);
  map_ = nullptr;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

std::span<const std::byte> SafetensorsFile::bytes(const TensorInfo& tensor) const {
  return bytes(tensor, 0, tensor.nbytes());
}

std::span<const std::byte> SafetensorsFile::bytes(const TensorInfo& tensor, uint64_t offset, uint64_t length) const {
  const uint64_t data_size = size_ - data_start_;
  const uint64_t n = tensor.nbytes();
  if (!map_ || tensor.offset > data_size || n > data_size - tensor.offset)
    fail("tensor '{}' lies outside safetensors file '{}'", tensor.name, path_.string());
  if (offset > n || length > n - offset)
    fail("safetensors file '{}': bytes [{}, {}) asked of tensor '{}', which has {} bytes", path_.string(), offset,
         offset + length, tensor.name, n);
  bytes_read_ += length;
  return {map_ + data_start_ + tensor.offset + offset, static_cast<size_t>(length)};
}

void SafetensorsFile::release_pages(std::span<const std::byte> bytes) const {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = (reinterpret_cast<uintptr_t>(bytes.data()) + page - 1) / page * page;
  const auto end = (reinterpret_cast<uintptr_t>(bytes.data()) + bytes.size()) / page * page;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);  // advisory: errors are harmless
}

// ---- Writing -------------------------------------------------------------------------------------

void write_all(int fd, std::span<const std::byte> data, const std::filesystem::path& path) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), std::min<size_t>(data.size(), size_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("cannot write '{}': {}", path.string(), std::strerror(errno));
    }
    data = data.subspan(static_cast<size_t>(n));
    watchdog_progress();  // a long save keeps the ranks waiting for it patient
  }
}

void sync_directory(const std::filesystem::path& dir) {
  // Best effort: some filesystems refuse fsync on directories, and the data is already synced.
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

SafetensorsWriter::SafetensorsWriter(std::filesystem::path path, std::vector<TensorSpec> tensors,
                                     const std::map<std::string, std::string>& metadata)
    : path_(std::move(path)), tensors_(std::move(tensors)) {
  const std::string where = fmt::format("safetensors writer for '{}'", path_.string());
  std::unordered_map<std::string, size_t> seen;
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  // The reference implementation puts the metadata first; readers do not care, people do.
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  for (const TensorSpec& t : tensors_) {
    if (t.name.empty() || t.name == "__metadata__")
      fail("{}: '{}' cannot be a tensor name", where, t.name);
    if (!seen.emplace(t.name, seen.size()).second) fail("{}: tensor '{}' is declared twice", where, t.name);
    auto numel = checked_numel(t.shape);
    if (!numel || *numel > std::numeric_limits<int64_t>::max() / 8)
      fail("{}: tensor '{}' has an invalid shape {}", where, t.name, shape_text(t.shape));
    const uint64_t begin = total_;
    total_ += t.nbytes();
    ends_.push_back(total_);
    header[t.name] = {{"dtype", std::string(dtype_name(t.dtype))}, {"shape", t.shape}, {"data_offsets", {begin, total_}}};
  }

  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // data then starts 8-byte aligned
  std::vector<std::byte> prefix(8 + json.size());
  put_le64(prefix.data(), json.size());
  std::memcpy(prefix.data() + 8, json.data(), json.size());

  const std::filesystem::path tmp = temporary_path();
  const uint64_t file_size = prefix.size() + total_;
  direct_ = file_size >= kDirectMinBytes;
  fd_ = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | (direct_ ? O_DIRECT : 0), 0644);
  if (fd_ < 0 && direct_) {  // e.g. tmpfs: no O_DIRECT there
    direct_ = false;
    fd_ = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  }
  if (fd_ < 0) fail("{}: cannot create '{}': {}", where, tmp.string(), std::strerror(errno));
  staging_capacity_ = static_cast<size_t>(std::min<uint64_t>(kStagingBytes, (file_size + kBlock - 1) / kBlock * kBlock));
  staging_ = {static_cast<std::byte*>(std::aligned_alloc(kBlock, staging_capacity_)), &std::free};
  if (!staging_) {
    abandon();
    fail("{}: out of memory for a {}-byte write buffer", where, staging_capacity_);
  }
  try {
    append(prefix);
  } catch (...) {
    abandon();
    throw;
  }
}

void SafetensorsWriter::append(std::span<const std::byte> data) {
  while (!data.empty()) {
    const size_t n = std::min(data.size(), staging_capacity_ - staged_);
    std::memcpy(staging_.get() + staged_, data.data(), n);
    staged_ += n;
    data = data.subspan(n);
    if (staged_ == staging_capacity_) flush_staging(false);
  }
}

void SafetensorsWriter::flush_staging(bool final) {
  if (staged_ == 0) return;
  auto leave_direct_mode = [&] {
    int flags = ::fcntl(fd_, F_GETFL);
    if (flags >= 0) ::fcntl(fd_, F_SETFL, flags & ~O_DIRECT);
    direct_ = false;
  };
  // The last piece need not be whole blocks: write it through the page cache.
  if (direct_ && (final || staged_ % kBlock != 0)) leave_direct_mode();
  size_t done = 0;
  while (done < staged_) {
    ssize_t n = ::write(fd_, staging_.get() + done, std::min<size_t>(staged_ - done, size_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EINVAL && direct_) {  // the filesystem took O_DIRECT at open but refuses it now
        leave_direct_mode();
        continue;
      }
      fail("cannot write '{}': {}", temporary_path().string(), std::strerror(errno));
    }
    done += static_cast<size_t>(n);
    if (direct_ && done % kBlock != 0) leave_direct_mode();  // a short write broke the alignment
  }
  staged_ = 0;
}

SafetensorsWriter::SafetensorsWriter(SafetensorsWriter&& other) noexcept
    : path_(std::move(other.path_)),
      tensors_(std::move(other.tensors_)),
      ends_(std::move(other.ends_)),
      total_(other.total_),
      written_(other.written_),
      fd_(std::exchange(other.fd_, -1)),
      finished_(std::exchange(other.finished_, true)),
      direct_(other.direct_),
      staging_(std::move(other.staging_)),
      staging_capacity_(other.staging_capacity_),
      staged_(other.staged_) {}

SafetensorsWriter::~SafetensorsWriter() {
  if (!finished_) abandon();
}

std::filesystem::path SafetensorsWriter::temporary_path() const {
  std::filesystem::path tmp = path_;
  tmp += ".tmp";
  return tmp;
}

void SafetensorsWriter::abandon() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  std::error_code ignored;
  std::filesystem::remove(temporary_path(), ignored);
  finished_ = true;
}

size_t SafetensorsWriter::current_tensor() const {
  return static_cast<size_t>(std::upper_bound(ends_.begin(), ends_.end(), written_) - ends_.begin());
}

void SafetensorsWriter::write(std::span<const std::byte> data) {
  if (finished_ || fd_ < 0) fail("safetensors writer for '{}': write() after finish()", path_.string());
  if (data.size() > total_ - written_)
    fail("safetensors writer for '{}': received {} bytes more than the {} bytes declared for its tensors",
         path_.string(), data.size() - (total_ - written_), total_);
  append(data);
  written_ += data.size();
}

void SafetensorsWriter::finish() {
  if (finished_ || fd_ < 0) fail("safetensors writer for '{}': finish() called twice", path_.string());
  if (written_ != total_) {
    const size_t i = current_tensor();
    const uint64_t begin = i == 0 ? 0 : ends_[i - 1];
    fail("safetensors writer for '{}': finished after {} of {} bytes; tensor '{}' got {} of its {} bytes",
         path_.string(), written_, total_, tensors_[i].name, written_ - begin, ends_[i] - begin);
  }
  const std::filesystem::path tmp = temporary_path();
  flush_staging(true);
  if (::fsync(fd_) != 0) fail("cannot flush '{}' to disk: {}", tmp.string(), std::strerror(errno));
  int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) fail("cannot close '{}': {}", tmp.string(), std::strerror(errno));
  std::error_code ec;
  std::filesystem::rename(tmp, path_, ec);
  if (ec) fail("cannot rename '{}' to '{}': {}", tmp.string(), path_.string(), ec.message());
  finished_ = true;
  sync_directory(path_.parent_path());
}

void write_safetensors(const std::filesystem::path& path,
                       const std::vector<std::pair<TensorSpec, std::vector<std::byte>>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSpec> specs;
  for (const auto& [spec, data] : tensors) {
    if (checked_numel(spec.shape) && data.size() != spec.nbytes())
      fail("write_safetensors '{}': tensor '{}' has {} bytes of data but its shape {} of {} needs {}",
           path.string(), spec.name, data.size(), shape_text(spec.shape), dtype_name(spec.dtype), spec.nbytes());
    specs.push_back(spec);
  }
  SafetensorsWriter writer(path, std::move(specs), metadata);
  for (const auto& [spec, data] : tensors) writer.write(data);
  writer.finish();
}

}  // namespace fsdpq
