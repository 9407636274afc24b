#include "io/checkpoint_file.h"

#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <optional>
#include <stdexcept>
#include <utility>

#include "io/file_digest.h"
#include "io/safetensors.h"  // sync_directory
#include "kernels/splitmix64.h"
#include "runtime/watchdog.h"
#include "util/error.h"
#include "util/shape_text.h"
#include "util/strings.h"

namespace fsdpq {
namespace fs = std::filesystem;
namespace {

// ---- Errors that every rank of a communicator agrees on --------------------------------------------

enum class ErrorKind : int { kNone = 0, kUser = 1, kLogic = 2, kOther = 3 };

// Runs `step` on this rank, then agrees with the other ranks of `comm`: when it threw anywhere,
// every rank throws the error of the lowest failing rank, of the same kind (UserError,
// std::logic_error, or std::runtime_error for anything else), and `agreed` is set. Collective.
// A step must not contain a collective call after something that may throw on some ranks only:
// the ranks that did not throw would wait in it for the ones that did.
void agree(MPI_Comm comm, bool& agreed, const std::function<void()>& step) {
  ErrorKind kind = ErrorKind::kNone;
  std::string message;
  try {
    step();
  } catch (const UserError& e) {
    kind = ErrorKind::kUser;
    message = e.what();
  } catch (const std::logic_error& e) {
    kind = ErrorKind::kLogic;
    message = e.what();
  } catch (const std::exception& e) {
    kind = ErrorKind::kOther;
    message = e.what();
  } catch (...) {
    kind = ErrorKind::kOther;
    message = "an exception that is not a std::exception";
  }
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  int candidate = kind != ErrorKind::kNone ? rank : size;
  int first_failed = size;
  MPI_Allreduce(&candidate, &first_failed, 1, MPI_INT, MPI_MIN, comm);
  if (first_failed == size) return;
  int header[2] = {static_cast<int>(kind), static_cast<int>(std::min<size_t>(message.size(), INT_MAX))};
  MPI_Bcast(header, 2, MPI_INT, first_failed, comm);
  message.resize(static_cast<size_t>(header[1]));
  MPI_Bcast(message.data(), header[1], MPI_CHAR, first_failed, comm);
  agreed = true;
  switch (static_cast<ErrorKind>(header[0])) {
    case ErrorKind::kUser: throw UserError(message);
    case ErrorKind::kLogic: throw std::logic_error(message);
    default: throw std::runtime_error(message);
  }
}

// Rank `root`'s `text` on every rank. Collective.
std::string broadcast_string(MPI_Comm comm, const std::string& text, int root) {
  uint64_t size = text.size();
  MPI_Bcast(&size, 1, MPI_UINT64_T, root, comm);
  if (size > static_cast<uint64_t>(INT_MAX))
    throw std::length_error(fmt::format("cannot broadcast a string of {} bytes: MPI counts are ints", size));
  std::string out = text;
  out.resize(size);
  MPI_Bcast(out.data(), static_cast<int>(size), MPI_CHAR, root, comm);
  return out;
}

// ---- HDF5 ------------------------------------------------------------------------------------------

// HDF5 prints its error stack to stderr by default; fsdpq reports errors itself (with the reason
// taken from the stack, see hdf5_reason). The setting is per process, so every entry point sets it.
void silence_hdf5_errors() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

// The innermost message of HDF5's current error stack ("MPI_ERR_ACCESS: permission denied",
// "truncated file: eof = ..."), as ": <message>", or "" when the stack is empty. Call it right
// after the failing call: the next HDF5 call clears the stack.
std::string hdf5_reason() {
  std::string innermost;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_UPWARD,
      [](unsigned n, const H5E_error2_t* err, void* data) -> herr_t {
        if (n == 0 && err->desc) *static_cast<std::string*>(data) = err->desc;
        return 0;
      },
      &innermost);
  return innermost.empty() ? std::string() : ": " + innermost;
}

// Owns one HDF5 identifier and closes it with `Close`.
template <herr_t (*Close)(hid_t)>
class Handle {
 public:
  Handle() = default;
  explicit Handle(hid_t id) : id_(id) {}
  Handle(Handle&& other) noexcept : id_(std::exchange(other.id_, -1)) {}
  Handle& operator=(Handle&& other) noexcept {
    if (this != &other) {
      reset();
      id_ = std::exchange(other.id_, -1);
    }
    return *this;
  }
  ~Handle() { reset(); }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  hid_t release() { return std::exchange(id_, -1); }
  void reset() {
    if (id_ >= 0) Close(id_);
    id_ = -1;
  }

 private:
  hid_t id_ = -1;
};
using PropertyList = Handle<H5Pclose>;
using Dataspace = Handle<H5Sclose>;
using Datatype = Handle<H5Tclose>;
using Attribute = Handle<H5Aclose>;
using Dataset = Handle<H5Dclose>;
using Object = Handle<H5Oclose>;

// A file access property list for MPI-IO on `comm`. Dense attribute storage (the 1.8 format) lifts
// the 64 KiB limit on one attribute, which a large 'meta' would hit; 1.8 is readable by every
// HDF5 and h5py still in use.
PropertyList mpio_file_access(MPI_Comm comm) {
  PropertyList fapl(H5Pcreate(H5P_FILE_ACCESS));
  if (!fapl.valid() || H5Pset_fapl_mpio(fapl.get(), comm, MPI_INFO_NULL) < 0 ||
      H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_V18) < 0)
    throw std::runtime_error("cannot set up HDF5's MPI-IO file access" + hdf5_reason());
  return fapl;
}

// A fixed-length UTF-8 string type of exactly the text's bytes (no terminator: the length says it).
Datatype string_type(size_t length) {
  Datatype type(H5Tcopy(H5T_C_S1));
  if (!type.valid() || H5Tset_size(type.get(), std::max<size_t>(length, 1)) < 0 ||
      H5Tset_strpad(type.get(), H5T_STR_NULLPAD) < 0 || H5Tset_cset(type.get(), H5T_CSET_UTF8) < 0)
    throw std::runtime_error("cannot make an HDF5 string type" + hdf5_reason());
  return type;
}

// Creates and writes one attribute of `object`. Collective in parallel HDF5: every rank passes the
// same value. `where` names the file (and tensor) for the error.
void write_attribute(hid_t object, const char* name, hid_t file_type, hid_t memory_type, hid_t space,
                     const void* data, const std::string& where) {
  Attribute attribute(H5Acreate2(object, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT));
  if (!attribute.valid()) fail("{}: cannot create attribute '{}'{}", where, name, hdf5_reason());
  if (H5Awrite(attribute.get(), memory_type, data) < 0) fail("{}: cannot write attribute '{}'{}", where, name, hdf5_reason());
}

void write_string_attribute(hid_t object, const char* name, const std::string& text, const std::string& where) {
  Datatype type = string_type(text.size());
  Dataspace scalar(H5Screate(H5S_SCALAR));
  std::string padded = text;
  padded.resize(std::max<size_t>(text.size(), 1), '\0');  // the type is at least one byte
  write_attribute(object, name, type.get(), type.get(), scalar.get(), padded.data(), where);
}

// An opened attribute, or nothing when `object` has none of that name.
std::optional<Attribute> open_attribute(hid_t object, const char* name, const std::string& where) {
  htri_t exists = H5Aexists(object, name);
  if (exists < 0) fail("{}: cannot look up attribute '{}'{}", where, name, hdf5_reason());
  if (exists == 0) return std::nullopt;
  Attribute attribute(H5Aopen(object, name, H5P_DEFAULT));
  if (!attribute.valid()) fail("{}: cannot open attribute '{}'{}", where, name, hdf5_reason());
  return attribute;
}

hssize_t attribute_elements(hid_t attribute, const char* name, const std::string& where) {
  Dataspace space(H5Aget_space(attribute));
  hssize_t n = space.valid() ? H5Sget_simple_extent_npoints(space.get()) : -1;
  if (n < 0) fail("{}: cannot read the size of attribute '{}'{}", where, name, hdf5_reason());
  return n;
}

// A string attribute (fixed-length, as fsdpq writes it, or variable-length, as h5py does).
std::optional<std::string> read_string_attribute(hid_t object, const char* name, const std::string& where) {
  std::optional<Attribute> attribute = open_attribute(object, name, where);
  if (!attribute) return std::nullopt;
  Datatype type(H5Aget_type(attribute->get()));
  if (!type.valid() || H5Tget_class(type.get()) != H5T_STRING)
    fail("{}: attribute '{}' must be a string", where, name);
  if (attribute_elements(attribute->get(), name, where) != 1)
    fail("{}: attribute '{}' must be a single string", where, name);
  if (H5Tis_variable_str(type.get()) > 0) {
    char* value = nullptr;
    if (H5Aread(attribute->get(), type.get(), &value) < 0)
      fail("{}: cannot read attribute '{}'{}", where, name, hdf5_reason());
    std::string text = value ? value : "";
    H5free_memory(value);
    return text;
  }
  std::string text(H5Tget_size(type.get()), '\0');
  if (H5Aread(attribute->get(), type.get(), text.data()) < 0)
    fail("{}: cannot read attribute '{}'{}", where, name, hdf5_reason());
  text.resize(std::strlen(text.c_str()));  // drop the padding (or a terminator)
  return text;
}

// An integer attribute's values, converted by HDF5 to `memory_type` (a native integer type of T).
template <class T>
std::optional<std::vector<T>> read_integer_attribute(hid_t object, const char* name, hid_t memory_type,
                                                     const std::string& where) {
  std::optional<Attribute> attribute = open_attribute(object, name, where);
  if (!attribute) return std::nullopt;
  Datatype type(H5Aget_type(attribute->get()));
  if (!type.valid() || H5Tget_class(type.get()) != H5T_INTEGER) fail("{}: attribute '{}' must hold integers", where, name);
  std::vector<T> values(static_cast<size_t>(attribute_elements(attribute->get(), name, where)));
  if (!values.empty() && H5Aread(attribute->get(), memory_type, values.data()) < 0)
    fail("{}: cannot read attribute '{}'{}", where, name, hdf5_reason());
  return values;
}

// ---- Element ranges --------------------------------------------------------------------------------


// 0 + 1 + ... + (n - 1), modulo 2^64 (halving the even factor first keeps it exact modulo 2^64).
uint64_t triangular(uint64_t n) { return n % 2 == 0 ? (n / 2) * (n - 1) : n * ((n - 1) / 2); }

// The sum of the element indices offset ... offset + count - 1, modulo 2^64.
uint64_t index_sum(int64_t offset, int64_t count) {
  return static_cast<uint64_t>(count) * static_cast<uint64_t>(offset) + triangular(static_cast<uint64_t>(count));
}

// One HDF5 read or write call's worth of a slice: at most max_io_elements elements.
struct Piece {
  int64_t offset;
  int64_t count;
  const float* data;
};

std::vector<Piece> split_into_pieces(std::span<const FloatSlice> slices, int64_t max_io_elements) {
  std::vector<Piece> pieces;
  for (const FloatSlice& slice : slices) {
    const int64_t n = static_cast<int64_t>(slice.values.size());
    for (int64_t done = 0; done < n; done += max_io_elements)
      pieces.push_back({slice.offset + done, std::min(max_io_elements, n - done), slice.values.data() + done});
  }
  return pieces;
}

// This rank's even share [begin, end) of `numel` elements.
std::pair<int64_t, int64_t> portion_of(int64_t numel, int rank, int size) {
  const int64_t base = numel / size, extra = numel % size;
  const int64_t begin = rank * base + std::min<int64_t>(rank, extra);
  return {begin, begin + base + (rank < extra ? 1 : 0)};
}

void check_max_io_elements(int64_t max_io_elements) {
  // The bytes of one call must fit in an int: MPI-IO counts are ints.
  constexpr int64_t kLimit = INT_MAX / static_cast<int64_t>(sizeof(float));
  if (max_io_elements <= 0 || max_io_elements > kLimit)
    throw std::logic_error(fmt::format("max_io_elements must be in [1, {}], got {}", kLimit, max_io_elements));
}

std::string checkpoint_where(const fs::path& path) { return fmt::format("checkpoint '{}'", path.string()); }

// fsync()s a file's data: MPI_File_sync flushed it from the writers, this makes it rank 0's
// business before the rename publishes it.
void sync_file(const fs::path& path, const std::string& where) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot open '{}' to sync it to storage: {}", where, path.string(), std::strerror(errno));
  int rc;
  do {
    rc = ::fsync(fd);
  } while (rc != 0 && errno == EINTR);
  const int err = errno;
  ::close(fd);
  if (rc != 0) fail("{}: cannot sync '{}' to storage: {}", where, path.string(), std::strerror(err));
}

// This rank's slices of a tensor of `numel` elements: each inside it, none overlapping another.
void check_slices(std::span<const FloatSlice> slices, int64_t numel, int rank, const std::string& where) {
  std::vector<std::pair<int64_t, int64_t>> ranges;  // [begin, end) of this rank's slices
  for (const FloatSlice& slice : slices) {
    const int64_t count = static_cast<int64_t>(slice.values.size());
    if (slice.offset < 0 || slice.offset > numel || count > numel - slice.offset)
      throw std::logic_error(fmt::format("{}: rank {}'s slice [{}, {}) is outside its {} elements", where, rank,
                                         slice.offset, slice.offset + count, numel));
    if (count > 0) ranges.emplace_back(slice.offset, slice.offset + count);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second)
      throw std::logic_error(fmt::format("{}: rank {}'s slices [{}, {}) and [{}, {}) overlap", where, rank,
                                         ranges[i - 1].first, ranges[i - 1].second, ranges[i].first, ranges[i].second));
}

// Every element exactly once across the ranks of `comm`: the count alone would miss an overlap that
// hides a gap of the same size; the index sum catches that (but for contrived patterns of both).
// Collective; every rank sees the same sums, so all throw together (and set `agreed_failure`).
void check_slices_cover_the_tensor(MPI_Comm comm, bool& agreed_failure, std::span<const FloatSlice> slices,
                                   int64_t numel, const std::vector<int64_t>& shape, const std::string& where) {
  uint64_t coverage[2] = {0, 0};
  for (const FloatSlice& slice : slices) {
    coverage[0] += slice.values.size();
    coverage[1] += index_sum(slice.offset, static_cast<int64_t>(slice.values.size()));
  }
  MPI_Allreduce(MPI_IN_PLACE, coverage, 2, MPI_UINT64_T, MPI_SUM, comm);
  if (coverage[0] == static_cast<uint64_t>(numel) && coverage[1] == triangular(static_cast<uint64_t>(numel))) return;
  agreed_failure = true;
  if (coverage[0] != static_cast<uint64_t>(numel))
    throw std::logic_error(fmt::format("{}: the ranks' slices hold {} elements in all, but its shape {} has {}: "
                                       "together they must cover every element exactly once",
                                       where, coverage[0], shape_text(shape), numel));
  throw std::logic_error(fmt::format("{}: the ranks' slices overlap and leave a gap: together they must cover "
                                     "every element exactly once",
                                     where));
}

// A 1-D fp32 dataset of `numel` elements named `name` in `file`. Collective in parallel HDF5.
Dataset create_tensor_dataset(hid_t file, const std::string& name, int64_t numel, const std::string& where) {
  const hsize_t dims = static_cast<hsize_t>(numel);
  Dataspace space(H5Screate_simple(1, &dims, nullptr));
  PropertyList dcpl(H5Pcreate(H5P_DATASET_CREATE));
  // Every element is written below: filling the dataset with zeros first would write it twice.
  H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER);
  Dataset dataset(H5Dcreate2(file, name.c_str(), H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT));
  if (!dataset.valid()) fail("{}: cannot create its dataset{}", where, hdf5_reason());
  return dataset;
}

// Writes this rank's `pieces` into `dataset` with `calls` collective H5Dwrite calls (the most any
// rank needs): a rank with fewer pieces makes up the difference with empty selections, and one
// whose write failed keeps calling too. Returns the first error, or an empty string.
std::string write_pieces_collectively(const Dataset& dataset, const std::vector<Piece>& pieces, uint64_t calls,
                                      const std::string& where) {
  PropertyList dxpl(H5Pcreate(H5P_DATASET_XFER));
  H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_COLLECTIVE);
  Dataspace file_space(H5Dget_space(dataset.get()));
  std::string error;
  const float unused = 0;  // the buffer of an empty write
  for (uint64_t k = 0; k < calls; ++k) {
    const hsize_t count = k < pieces.size() ? static_cast<hsize_t>(pieces[k].count) : 1;
    Dataspace memory_space(H5Screate_simple(1, &count, nullptr));
    const float* data = &unused;
    bool selected = false;
    if (k < pieces.size()) {
      const hsize_t start = static_cast<hsize_t>(pieces[k].offset);
      selected = H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &start, nullptr, &count, nullptr) >= 0;
      if (!selected && error.empty()) error = fmt::format("{}: cannot select elements{}", where, hdf5_reason());
      data = pieces[k].data;
    }
    if (!selected) {
      H5Sselect_none(file_space.get());
      H5Sselect_none(memory_space.get());
    }
    if (H5Dwrite(dataset.get(), H5T_NATIVE_FLOAT, memory_space.get(), file_space.get(), dxpl.get(), data) < 0 &&
        error.empty())
      error = k < pieces.size() ? fmt::format("{}: cannot write elements [{}, {}){}", where, pieces[k].offset,
                                              pieces[k].offset + pieces[k].count, hdf5_reason())
                                : fmt::format("{}: cannot take part in a collective write{}", where, hdf5_reason());
  }
  return error;
}

// The tensor's "shape" and "checksum" attributes, then closes its dataset. Collective.
void finish_tensor_dataset(Dataset& dataset, const std::vector<int64_t>& shape, uint64_t checksum,
                           const std::string& where) {
  const hsize_t rank = shape.size();
  Dataspace shape_space(H5Screate_simple(1, &rank, nullptr));
  const int64_t none = 0;  // the buffer of a scalar's empty shape
  write_attribute(dataset.get(), "shape", H5T_STD_I64LE, H5T_NATIVE_INT64, shape_space.get(),
                  shape.empty() ? &none : shape.data(), where);
  Dataspace scalar(H5Screate(H5S_SCALAR));
  write_attribute(dataset.get(), "checksum", H5T_STD_U64LE, H5T_NATIVE_UINT64, scalar.get(), &checksum, where);
  if (H5Dclose(dataset.release()) < 0) fail("{}: cannot close its dataset{}", where, hdf5_reason());
}

}  // namespace

// ---- Checksum and names ----------------------------------------------------------------------------

uint64_t checksum_elements(int64_t offset, std::span<const float> values) {
  const int64_t n = static_cast<int64_t>(values.size());
  const float* data = values.data();
  uint64_t sum = 0;
  // Unsigned sums wrap modulo 2^64 in any order, so the threads' partial sums add up exactly.
#pragma omp parallel for reduction(+ : sum) schedule(static) if (n >= (int64_t{1} << 20))
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, data + i, sizeof bits);
    sum += mix64((static_cast<uint64_t>(offset + i) * kGolden64) ^ bits ^ kChecksumSeed);
  }
  return sum;
}

fs::path checkpoint_temp_path(const fs::path& final_path) {
  std::string name = ".";
  name += final_path.filename().string();
  name += ".tmp";
  return final_path.parent_path() / name;
}

// ---- Writing ---------------------------------------------------------------------------------------

CheckpointWriter::CheckpointWriter(MPI_Comm comm, fs::path final_path, int64_t max_io_elements)
    : comm_(comm),
      final_path_(std::move(final_path)),
      temp_path_(checkpoint_temp_path(final_path_)),
      max_io_elements_(max_io_elements),
      uncaught_at_start_(std::uncaught_exceptions()) {
  const WaitScope waiting("creating a checkpoint file (collective I/O)");
  silence_hdf5_errors();
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  const std::string where = checkpoint_where(final_path_);
  agree(comm_, agreed_failure_, [&] {
    check_max_io_elements(max_io_elements_);
    if (final_path_.filename().empty() || final_path_.filename() == "." || final_path_.filename() == "..")
      throw std::logic_error(fmt::format("{}: the path must end in a file name", where));
    if (rank_ != 0) return;
    // One rank prepares the directory; the others see it through the shared file system.
    std::error_code ec;
    const fs::path dir = final_path_.parent_path();
    if (!dir.empty() && !fs::is_directory(dir, ec)) {
      fs::create_directories(dir, ec);
      if (ec) fail("{}: cannot create its directory '{}': {}", where, dir.string(), ec.message());
    }
    fs::remove(temp_path_, ec);  // a stale one from a write that never committed
    if (ec) fail("{}: cannot remove the stale temporary file '{}': {}", where, temp_path_.string(), ec.message());
  });
  agree(comm_, agreed_failure_, [&] {
    PropertyList fapl = mpio_file_access(comm_);
    file_ = H5Fcreate(temp_path_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get());
    // Should only some ranks have failed, the others' handles stay open: closing is collective.
    if (file_ < 0) fail("{}: cannot create the temporary file '{}'{}", where, temp_path_.string(), hdf5_reason());
  });
}

void CheckpointWriter::write_tensor(const std::string& name, const std::vector<int64_t>& shape,
                                    std::span<const FloatSlice> slices) {
  const WaitScope waiting("writing a checkpoint tensor (collective I/O)");
  agreed_failure_ = false;  // an earlier agreed error was handled, or we would not be here
  const std::string where = fmt::format("{}: tensor '{}'", checkpoint_where(final_path_), name);

  // Local checks first, then agreement, so that no rank enters a collective call another left.
  std::string signature = name;
  signature.push_back('\0');
  for (int64_t d : shape) signature += std::to_string(d) + ",";
  const std::string root_signature = broadcast_string(comm_, signature, 0);
  int64_t numel = 0;
  agree(comm_, agreed_failure_, [&] {
    if (committed_ || file_ < 0) throw std::logic_error(fmt::format("{}: the checkpoint is already committed", where));
    if (signature != root_signature)
      throw std::logic_error(fmt::format("{} of shape {} on rank {}: rank 0 passes another name or shape; every rank "
                                         "must write the same tensors in the same order",
                                         where, shape_text(shape), rank_));
    if (name.empty() || name == "." || name.find('/') != std::string::npos || name.find('\0') != std::string::npos)
      throw std::logic_error(fmt::format("{}: a tensor name must be non-empty, not '.', and hold no '/' or NUL", where));
    if (std::find(names_.begin(), names_.end(), name) != names_.end())
      throw std::logic_error(fmt::format("{}: written twice", where));
    std::optional<int64_t> n = checked_numel(shape);
    if (!n) throw std::logic_error(fmt::format("{}: shape {} has a negative dimension or too many elements", where, shape_text(shape)));
    numel = *n;
    check_slices(slices, numel, rank_, where);
  });
  check_slices_cover_the_tensor(comm_, agreed_failure_, slices, numel, shape, where);

  Dataset dataset;
  agree(comm_, agreed_failure_, [&] { dataset = create_tensor_dataset(file_, name, numel, where); });

  // Collective transfer lets MPI-IO merge the ranks' interleaved slices into large writes; every
  // rank must then make the same number of H5Dwrite calls.
  const std::vector<Piece> pieces = split_into_pieces(slices, max_io_elements_);
  uint64_t calls = pieces.size();
  MPI_Allreduce(MPI_IN_PLACE, &calls, 1, MPI_UINT64_T, MPI_MAX, comm_);
  agree(comm_, agreed_failure_, [&] {
    const std::string error = write_pieces_collectively(dataset, pieces, calls, where);
    if (!error.empty()) throw UserError(error);
  });

  uint64_t checksum = 0;
  for (const FloatSlice& slice : slices) checksum += checksum_elements(slice.offset, slice.values);
  MPI_Allreduce(MPI_IN_PLACE, &checksum, 1, MPI_UINT64_T, MPI_SUM, comm_);
  agree(comm_, agreed_failure_, [&] { finish_tensor_dataset(dataset, shape, checksum, where); });
  names_.push_back(name);
}

void CheckpointWriter::commit(const nlohmann::json& meta) {
  const WaitScope waiting("committing a checkpoint (collective I/O)");
  agreed_failure_ = false;
  const std::string where = checkpoint_where(final_path_);
  std::string meta_text;
  agree(comm_, agreed_failure_, [&] {
    if (committed_ || file_ < 0) throw std::logic_error(fmt::format("{}: committed twice", where));
    if (rank_ != 0) return;
    try {
      meta_text = meta.dump();
    } catch (const nlohmann::json::exception& e) {
      throw std::logic_error(fmt::format("{}: meta cannot be stored as JSON text: {}", where, e.what()));
    }
  });
  meta_text = broadcast_string(comm_, meta_text, 0);

  agree(comm_, agreed_failure_, [&] {
    const hid_t root = static_cast<hid_t>(file_);
    write_string_attribute(root, "format", kCheckpointFormat, where);
    Dataspace scalar(H5Screate(H5S_SCALAR));
    const int32_t version = kCheckpointFormatVersion;
    write_attribute(root, "format_version", H5T_STD_I32LE, H5T_NATIVE_INT32, scalar.get(), &version, where);
    write_string_attribute(root, "meta", meta_text, where);
    if (H5Fflush(root, H5F_SCOPE_GLOBAL) < 0)
      fail("{}: cannot flush the temporary file '{}' to storage{}", where, temp_path_.string(), hdf5_reason());
  });
  agree(comm_, agreed_failure_, [&] {
    const herr_t closed = H5Fclose(static_cast<hid_t>(file_));
    file_ = -1;
    if (closed < 0) fail("{}: cannot close the temporary file '{}'{}", where, temp_path_.string(), hdf5_reason());
  });
  // Publishing is rank 0's; the agreement after it is the barrier that keeps every rank here
  // until final_path exists.
  agree(comm_, agreed_failure_, [&] {
    if (rank_ != 0) return;
    sync_file(temp_path_, where);
    write_digest(final_path_, digest_file(temp_path_));  // before the rename: a published file always has one
    if (std::rename(temp_path_.c_str(), final_path_.c_str()) != 0)
      fail("{}: cannot rename '{}' to it: {}", where, temp_path_.string(), std::strerror(errno));
    sync_directory(final_path_.parent_path());  // the new name survives a crash
  });
  committed_ = true;
}

void CheckpointWriter::close_file_quietly() noexcept {
  if (file_ >= 0) H5Fclose(static_cast<hid_t>(file_));
  file_ = -1;
}

CheckpointWriter::~CheckpointWriter() {
  if (committed_) return;
  std::error_code ec;
  const bool foreign_unwinding = std::uncaught_exceptions() > uncaught_at_start_ && !agreed_failure_;
  if (foreign_unwinding && size_ > 1) {
    // Closing would wait for peers that may never come; the job is about to end anyway.
    fs::remove(temp_path_, ec);
    return;
  }
  close_file_quietly();
  if (rank_ == 0) fs::remove(temp_path_, ec);
  MPI_Barrier(comm_);  // no rank goes on while the temporary file is still there
}

// ---- Reading ---------------------------------------------------------------------------------------

namespace {

// What can be said about a file before HDF5 opens it: the clearer messages for the common cases.
void check_is_hdf5_file(const fs::path& path) {
  const std::string where = checkpoint_where(path);
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status)) fail("{} does not exist", where);
  if (!fs::is_regular_file(status)) fail("{} is not a regular file", where);
  if (fs::file_size(path, ec) == 0) fail("{} is empty (0 bytes): the write that made it did not finish", where);
  const htri_t is_hdf5 = H5Fis_hdf5(path.c_str());
  if (is_hdf5 < 0) fail("{}: cannot read it{}", where, hdf5_reason());
  if (is_hdf5 == 0) fail("{} is not an HDF5 file (it has no HDF5 signature), so not an fsdpq checkpoint", where);
  if (const std::optional<FileDigest> stored = read_digest(path)) {
    const FileDigest now = digest_file(path);
    if (now.bytes != stored->bytes)
      fail("{} is corrupt: it has {} bytes, but {} were written ({})", where, now.bytes, stored->bytes,
           digest_path(path).string());
    if (now.hash != stored->hash)
      fail("{} is corrupt: its bytes no longer match the digest written with it ({}); use an older checkpoint",
           where, digest_path(path).string());
  }
}

}  // namespace

CheckpointReader::CheckpointReader(MPI_Comm comm, fs::path path, int64_t max_io_elements)
    : comm_(comm), path_(std::move(path)), max_io_elements_(max_io_elements), uncaught_at_start_(std::uncaught_exceptions()) {
  const WaitScope waiting("opening a checkpoint (collective I/O)");
  silence_hdf5_errors();
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  const std::string where = checkpoint_where(path_);
  bool agreed = false;
  agree(comm_, agreed, [&] {
    check_max_io_elements(max_io_elements_);
    if (rank_ == 0) check_is_hdf5_file(path_);
  });
  agree(comm_, agreed, [&] {
    PropertyList fapl(H5Pcreate(H5P_FILE_ACCESS));
    if (!fapl.valid() || H5Pset_fapl_mpio(fapl.get(), comm_, MPI_INFO_NULL) < 0)
      throw std::runtime_error("cannot set up HDF5's MPI-IO file access" + hdf5_reason());
    file_ = H5Fopen(path_.c_str(), H5F_ACC_RDONLY, fapl.get());
    // (Should only some ranks have failed, the others' handles stay open: closing is collective.)
    if (file_ < 0) fail("{}: HDF5 cannot open it (the file is truncated or corrupt){}", where, hdf5_reason());
  });
  try {
    agree(comm_, agreed, [&] {
      const hid_t root = static_cast<hid_t>(file_);
      const std::optional<std::string> format = read_string_attribute(root, "format", where);
      if (!format)
        fail("{}: not an fsdpq checkpoint: it has no 'format' attribute (an fsdpq checkpoint has format = '{}'; an "
             "unfinished one has none)",
             where, kCheckpointFormat);
      if (*format != kCheckpointFormat)
        fail("{}: not an fsdpq checkpoint: its format is '{}', expected '{}'", where, *format, kCheckpointFormat);
      const auto version = read_integer_attribute<int64_t>(root, "format_version", H5T_NATIVE_INT64, where);
      if (!version || version->size() != 1) fail("{}: has no single integer 'format_version' attribute", where);
      if ((*version)[0] != kCheckpointFormatVersion)
        fail("{}: format_version {} is not one this fsdpq reads (it reads version {})", where, (*version)[0],
             kCheckpointFormatVersion);
      const std::optional<std::string> meta = read_string_attribute(root, "meta", where);
      if (!meta) fail("{}: has no 'meta' attribute", where);
      try {
        meta_ = nlohmann::json::parse(*meta);
      } catch (const nlohmann::json::parse_error& e) {
        fail("{}: its 'meta' attribute is not valid JSON (error at byte {})", where, e.byte);
      }

      H5G_info_t info;
      if (H5Gget_info(root, &info) < 0) fail("{}: cannot list its tensors{}", where, hdf5_reason());
      for (hsize_t i = 0; i < info.nlinks; ++i) {
        const ssize_t length = H5Lget_name_by_idx(root, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
        if (length < 0) fail("{}: cannot list its tensors{}", where, hdf5_reason());
        std::string name(static_cast<size_t>(length) + 1, '\0');
        H5Lget_name_by_idx(root, ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size(), H5P_DEFAULT);
        name.resize(static_cast<size_t>(length));
        const std::string tensor_where = fmt::format("{}: tensor '{}'", where, name);

        {
          Object object(H5Oopen(root, name.c_str(), H5P_DEFAULT));
          if (!object.valid()) fail("{}: cannot open it{}", tensor_where, hdf5_reason());
          if (H5Iget_type(object.get()) != H5I_DATASET)
            fail("{}: is not a dataset (a checkpoint holds only 1-D float32 datasets)", tensor_where);
        }
        Dataset dataset(H5Dopen2(root, name.c_str(), H5P_DEFAULT));
        if (!dataset.valid()) fail("{}: cannot open its dataset{}", tensor_where, hdf5_reason());
        Datatype type(H5Dget_type(dataset.get()));
        if (!type.valid() || H5Tget_class(type.get()) != H5T_FLOAT || H5Tget_size(type.get()) != 4)
          fail("{}: its dataset is not float32", tensor_where);
        Dataspace space(H5Dget_space(dataset.get()));
        hsize_t size = 0;
        if (!space.valid() || H5Sget_simple_extent_type(space.get()) != H5S_SIMPLE ||
            H5Sget_simple_extent_ndims(space.get()) != 1 || H5Sget_simple_extent_dims(space.get(), &size, nullptr) < 0)
          fail("{}: its dataset is not 1-D (a checkpoint stores tensors flat, with their shape in 'shape')", tensor_where);

        Tensor tensor;
        const auto shape = read_integer_attribute<int64_t>(dataset.get(), "shape", H5T_NATIVE_INT64, tensor_where);
        if (!shape) fail("{}: has no 'shape' attribute", tensor_where);
        tensor.shape = *shape;
        const std::optional<int64_t> numel = checked_numel(tensor.shape);
        if (!numel || static_cast<uint64_t>(*numel) != size)
          fail("{}: its shape {} does not match the {} elements of its dataset", tensor_where, shape_text(tensor.shape),
               size);
        tensor.numel = *numel;
        const auto checksum = read_integer_attribute<uint64_t>(dataset.get(), "checksum", H5T_NATIVE_UINT64, tensor_where);
        if (!checksum) fail("{}: has no 'checksum' attribute", tensor_where);
        if (checksum->size() != 1) fail("{}: its 'checksum' attribute must be a single uint64", tensor_where);
        tensor.checksum = (*checksum)[0];
        tensor.dataset = dataset.release();
        tensors_.emplace(name, std::move(tensor));
      }
    });
  } catch (...) {
    close_quietly();  // every rank is here: the error was agreed
    throw;
  }
}

void CheckpointReader::close_quietly() noexcept {
  for (auto& [name, tensor] : tensors_) {
    if (tensor.dataset >= 0) H5Dclose(static_cast<hid_t>(tensor.dataset));
    tensor.dataset = -1;
  }
  if (file_ >= 0) H5Fclose(static_cast<hid_t>(file_));
  file_ = -1;
}

CheckpointReader::~CheckpointReader() {
  // While a foreign exception unwinds, peers may never come to the collective close.
  if (std::uncaught_exceptions() > uncaught_at_start_ && size_ > 1) return;
  close_quietly();
}

std::vector<std::string> CheckpointReader::tensor_names() const {
  std::vector<std::string> names;
  for (const auto& [name, tensor] : tensors_) names.push_back(name);
  return names;
}

const CheckpointReader::Tensor& CheckpointReader::find(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it != tensors_.end()) return it->second;
  const std::string guess = closest_match(name, tensor_names());
  fail("{}: has no tensor '{}'{}", checkpoint_where(path_), name,
       guess.empty() ? "" : fmt::format(" (did you mean '{}'?)", guess));
}

std::vector<int64_t> CheckpointReader::shape(const std::string& name) const { return find(name).shape; }
int64_t CheckpointReader::numel(const std::string& name) const { return find(name).numel; }
uint64_t CheckpointReader::stored_checksum(const std::string& name) const { return find(name).checksum; }

void CheckpointReader::read(const std::string& name, int64_t offset, std::span<float> out) const {
  const Tensor& tensor = find(name);
  const std::string where = fmt::format("{}: tensor '{}'", checkpoint_where(path_), name);
  const int64_t n = static_cast<int64_t>(out.size());
  if (offset < 0 || offset > tensor.numel || n > tensor.numel - offset)
    fail("{}: elements [{}, {}) are outside its {} elements", where, offset, offset + n, tensor.numel);
  silence_hdf5_errors();
  Dataspace file_space(H5Dget_space(static_cast<hid_t>(tensor.dataset)));
  for (int64_t done = 0; done < n; done += max_io_elements_) {
    const hsize_t start = static_cast<hsize_t>(offset + done);
    const hsize_t count = static_cast<hsize_t>(std::min(max_io_elements_, n - done));
    Dataspace memory_space(H5Screate_simple(1, &count, nullptr));
    // The default transfer is independent: this rank reads alone.
    if (H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &start, nullptr, &count, nullptr) < 0 ||
        H5Dread(static_cast<hid_t>(tensor.dataset), H5T_NATIVE_FLOAT, memory_space.get(), file_space.get(), H5P_DEFAULT,
                out.data() + done) < 0)
      fail("{}: cannot read elements [{}, {}){}", where, start, start + count, hdf5_reason());
  }
}

void CheckpointReader::verify() const {
  const WaitScope waiting("verifying a checkpoint (collective I/O)");
  // Chunks bound the buffer; a rank's share of a large tensor may be gigabytes.
  const int64_t chunk = std::min<int64_t>(max_io_elements_, int64_t{1} << 22);
  std::vector<uint64_t> sums;
  bool agreed = false;
  agree(comm_, agreed, [&] {
    std::vector<float> buffer;
    for (const auto& [name, tensor] : tensors_) {
      const auto [begin, end] = portion_of(tensor.numel, rank_, size_);
      uint64_t sum = 0;
      for (int64_t at = begin; at < end; at += chunk) {
        buffer.resize(static_cast<size_t>(std::min(chunk, end - at)));
        read(name, at, buffer);
        sum += checksum_elements(at, buffer);
      }
      sums.push_back(sum);
    }
  });
  MPI_Allreduce(MPI_IN_PLACE, sums.data(), static_cast<int>(sums.size()), MPI_UINT64_T, MPI_SUM, comm_);
  size_t i = 0;
  for (const auto& [name, tensor] : tensors_) {
    if (sums[i] != tensor.checksum)
      fail("{}: tensor '{}' fails its checksum (stored {:#018x}, computed {:#018x}): the file is corrupt",
           checkpoint_where(path_), name, tensor.checksum, sums[i]);
    ++i;
  }
}

}  // namespace fsdpq
