// Checkpoint files: one HDF5 file per checkpoint, written by all ranks of a communicator at once
// through MPI-IO (each rank writes the flat element ranges it owns, FSDP-style), and readable
// afterwards at any rank count, by any subset of ranks, or by h5py / h5dump.
//
// Layout:
//   /               attributes  format         = "fsdpq-checkpoint" (string)
//                               format_version = 1 (int32)
//                               meta           = JSON text: whatever the trainer stores there
//   /<tensor name>  a 1-D float32 dataset of the tensor's numel, so that any flat element range is
//                   one hyperslab; attributes  shape    (int64[]: the logical shape)
//                                              checksum (uint64: see below)
// The root attributes are written last, by commit(): a file cut short never claims to be a
// checkpoint, and only a committed file carries its final name.
//
// Checksum. It must be computable from arbitrary slices, without gathering a tensor anywhere, so it
// is a position-keyed additive hash (all arithmetic modulo 2^64):
//     checksum = sum over elements i of  mix(i * 0x9E3779B97F4A7C15 ^ bits(value_i) ^ kChecksumSeed)
// where i is the flat element index within the tensor, bits() the IEEE-754 bit pattern (as a
// uint32, zero-extended), and mix() the splitmix64 finalizer:
//     z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9;  z = (z ^ (z >> 27)) * 0x94D049BB133111EB;  z ^ (z >> 31)
// Each rank sums over the slices it writes (or, in verify(), reads) and the sums are all-reduced.
// A flipped bit changes one element's term; moved or swapped elements change their position keys.
// Every element must be counted exactly once, which the writer ensures (see write_tensor).
#pragma once
#include <mpi.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace fsdpq {

inline constexpr const char* kCheckpointFormat = "fsdpq-checkpoint";
inline constexpr int kCheckpointFormatVersion = 1;
inline constexpr uint64_t kChecksumSeed = 0x243F6A8885A308D3;  // the hex digits of pi
// Elements per HDF5 read or write call: MPI-IO counts are ints, and 2 GiB and more in one call
// trips over that in MPI implementations and in HDF5. Larger slices go in pieces.
inline constexpr int64_t kMaxIoElements = int64_t{1} << 28;  // 1 GiB of float32

// The checksum terms of elements [offset, offset + values.size()) of one tensor (see above);
// sums of disjoint slices add up (mod 2^64) to the checksum of their union.
uint64_t checksum_elements(int64_t offset, std::span<const float> values);

// Where a writer stages `final_path` until commit: `<dir>/.<file name>.tmp`.
std::filesystem::path checkpoint_temp_path(const std::filesystem::path& final_path);

// Elements [offset, offset + values.size()) of a tensor, flat (row-major) indices.
struct FloatSlice {
  int64_t offset = 0;
  std::span<const float> values;
};

// Writes one checkpoint collectively. All public calls are collective over `comm` unless said
// otherwise: every rank makes the same calls in the same order. Errors inside a call are agreed:
// when one rank fails, every rank throws the same error (the lowest failing rank's message, as a
// UserError for file system and HDF5 failures, a std::logic_error for the caller's bugs), so no
// rank is left in a collective. HDF5 is not thread-safe: one thread per process uses these classes.
class CheckpointWriter {
 public:
  // Creates the temporary file checkpoint_temp_path(final_path), removing a stale one and creating
  // missing parent directories; a UserError names the path when that fails. `comm` must stay valid
  // while the writer lives. `max_io_elements` (tests) bounds the elements per write call; it must
  // be in [1, INT_MAX / 4] (std::logic_error otherwise). Data goes out with collective MPI-IO.
  CheckpointWriter(MPI_Comm comm, std::filesystem::path final_path, int64_t max_io_elements = kMaxIoElements);
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Writes one tensor of logical shape `shape` (numel = product; {} is a scalar of 1 element).
  // Every rank passes the same name and shape; `slices` are the parts THIS rank writes: possibly
  // none, in any order, not overlapping each other or another rank's. Together the ranks' slices
  // must cover the tensor exactly once: a slice out of range, overlapping slices on one rank,
  // ranks disagreeing on name or shape, or slices whose all-reduced element count (and sum of
  // element indices, which catches an overlap that hides a gap of the same size) differs from
  // the tensor's are bugs in the caller and throw std::logic_error on every rank. Replicated data
  // (DDP) is written by one rank; only written slices count in the checksum.
  // Tensor names are dataset names in the root group: not empty, no '/' or NUL, not "." and unique
  // (std::logic_error otherwise, also for a write after commit). After any of these errors nothing
  // of the tensor was written and the writer can go on.
  void write_tensor(const std::string& name, const std::vector<int64_t>& shape, std::span<const FloatSlice> slices);

  // Stores rank 0's `meta` (other ranks' are ignored) and the format attributes, flushes the file
  // to storage (MPI_File_sync through H5Fflush) and closes it, then rank 0 fsyncs it, renames it to
  // final_path (replacing an older file of that name) and fsyncs the directory. Only after commit()
  // returns does final_path exist; a crash before leaves only the temporary file. Once only
  // (std::logic_error the second time, as for a rank 0 `meta` that json::dump rejects).
  void commit(const nlohmann::json& meta);

  // Without a commit: closes the file and removes the temporary file; nothing escapes. That is
  // collective too. While an exception that did not come from this writer's own (agreed) calls
  // unwinds the stack, peers may not be here to close with: on more than one rank the file handle
  // is then left open (the job is about to abort) and each rank just unlinks the temporary file.
  ~CheckpointWriter();

  const std::filesystem::path& final_path() const { return final_path_; }
  const std::filesystem::path& temp_path() const { return temp_path_; }

 private:
  void close_file_quietly() noexcept;

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  std::filesystem::path final_path_;
  std::filesystem::path temp_path_;
  int64_t file_ = -1;  // hid_t
  int64_t max_io_elements_;
  bool committed_ = false;
  bool agreed_failure_ = false;  // an agreed error was thrown: every rank is unwinding together
  int uncaught_at_start_ = 0;
  std::vector<std::string> names_;  // written so far (duplicates are an error)
};

// Reads a checkpoint. The constructor, the destructor and verify() are collective over `comm`;
// the other calls are local: any rank may read any range at any time. Any communicator works,
// MPI_COMM_SELF included, at any size, whatever the writer's.
class CheckpointReader {
 public:
  // Opens `path` read-only and validates it: a missing, empty, truncated or non-HDF5 file, a file
  // without the fsdpq format attributes or of another format_version, a 'meta' that is not JSON,
  // or a tensor dataset that is not 1-D float32 or lacks a consistent 'shape' or 'checksum', is a
  // UserError naming the file (and the tensor) and what is wrong. Errors are agreed across ranks.
  CheckpointReader(MPI_Comm comm, std::filesystem::path path, int64_t max_io_elements = kMaxIoElements);
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;
  // Closes the file (collective; while a foreign exception unwinds on a multi-rank communicator
  // the handle is left open instead, as for the writer).
  ~CheckpointReader();

  const std::filesystem::path& path() const { return path_; }
  // The trainer's JSON as stored by CheckpointWriter::commit.
  const nlohmann::json& meta() const { return meta_; }
  // All tensors, sorted by name (byte-wise, as std::string compares).
  std::vector<std::string> tensor_names() const;
  bool has_tensor(const std::string& name) const { return tensors_.count(name) != 0; }
  // The logical shape / element count / stored checksum; a UserError naming the file and the
  // tensor (with a "did you mean") when there is no such tensor.
  std::vector<int64_t> shape(const std::string& name) const;
  int64_t numel(const std::string& name) const;
  uint64_t stored_checksum(const std::string& name) const;

  // Reads elements [offset, offset + out.size()) of a tensor into `out` (independent I/O: local,
  // any rank, any range). A range outside the tensor is a UserError naming the file and tensor.
  void read(const std::string& name, int64_t offset, std::span<float> out) const;

  // Every rank reads its 1/size portion of every tensor; the checksums are all-reduced and compared
  // with the stored ones. A mismatch is a UserError on every rank naming the file and the (first,
  // by name) failing tensor: "checkpoint 'F': tensor 'NAME' fails its checksum (stored X,
  // computed Y): the file is corrupt".
  void verify() const;

 private:
  struct Tensor {
    std::vector<int64_t> shape;
    int64_t numel = 0;
    uint64_t checksum = 0;
    int64_t dataset = -1;  // hid_t, open while the reader lives
  };
  const Tensor& find(const std::string& name) const;
  void close_quietly() noexcept;

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  std::filesystem::path path_;
  int64_t file_ = -1;  // hid_t
  int64_t max_io_elements_;
  int uncaught_at_start_ = 0;
  nlohmann::json meta_;
  std::map<std::string, Tensor> tensors_;
};

}  // namespace fsdpq
