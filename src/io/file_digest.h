// Whole-file digests for checkpoints. HDF5 does not checksum all of its own metadata and can
// crash (not fail) on a file whose group structures were damaged, so a checkpoint's bytes are
// hashed when it is committed and checked before HDF5 ever opens it. The digest lives beside the
// file as `<file>.digest` (one text line: "fsdpq-digest 1 <bytes> <hex>"); a file without one
// (made by another tool) is opened unchecked.
//
// The hash is the checkpoint checksum's position-keyed additive splitmix64 over the file's
// 8-byte little-endian words (the tail zero-padded), so it runs multi-threaded at memory speed.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>

namespace fsdpq {

struct FileDigest {
  uint64_t bytes = 0;
  uint64_t hash = 0;
  bool operator==(const FileDigest&) const = default;
};

FileDigest digest_file(const std::filesystem::path& path);  // UserError naming the file when unreadable
std::filesystem::path digest_path(const std::filesystem::path& file);
// Writes `<final_file>.digest` atomically (the digest describes the file it will be renamed to).
void write_digest(const std::filesystem::path& final_file, const FileDigest& digest);
// The stored digest; nullopt when there is none; UserError when it is unreadable.
std::optional<FileDigest> read_digest(const std::filesystem::path& file);

}  // namespace fsdpq
