#include "io/file_digest.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <vector>

#include "io/model_files.h"  // write_file_atomically
#include "kernels/splitmix64.h"
#include "util/error.h"

namespace fsdpq {
namespace {

constexpr uint64_t kDigestSeed = 0x13198A2E03707344;  // more digits of pi

}  // namespace

FileDigest digest_file(const std::filesystem::path& path) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"), std::fclose);
  if (!file) fail("cannot read '{}' to check its digest: {}", path.string(), std::strerror(errno));
  constexpr size_t kChunkWords = size_t{1} << 20;  // 8 MiB per read
  std::vector<uint64_t> words(kChunkWords);
  FileDigest d;
  uint64_t index = 0;
  for (;;) {
    std::memset(words.data(), 0, words.size() * sizeof(uint64_t));
    const size_t got = std::fread(words.data(), 1, words.size() * sizeof(uint64_t), file.get());
    if (got == 0) break;
    const int64_t n = static_cast<int64_t>((got + 7) / 8);
    uint64_t sum = 0;
#pragma omp parallel for reduction(+ : sum) schedule(static) if (n >= (int64_t{1} << 18))
    for (int64_t i = 0; i < n; ++i)
      sum += mix64(((index + static_cast<uint64_t>(i)) * kGolden64) ^ words[static_cast<size_t>(i)] ^ kDigestSeed);
    d.hash += sum;
    d.bytes += got;
    index += static_cast<uint64_t>(n);
    if (got < words.size() * sizeof(uint64_t)) break;
  }
  if (std::ferror(file.get())) fail("cannot read '{}' to check its digest: read error", path.string());
  d.hash ^= mix64(d.bytes ^ kDigestSeed);  // the length counts: a zero tail cut off is caught
  return d;
}

std::filesystem::path digest_path(const std::filesystem::path& file) {
  return file.parent_path() / (file.filename().string() + ".digest");
}

void write_digest(const std::filesystem::path& final_file, const FileDigest& digest) {
  write_file_atomically(digest_path(final_file), fmt::format("fsdpq-digest 1 {} {:016x}\n", digest.bytes, digest.hash));
}

std::optional<FileDigest> read_digest(const std::filesystem::path& file) {
  const std::filesystem::path path = digest_path(file);
  if (!std::filesystem::exists(path)) return std::nullopt;
  std::ifstream in(path);
  std::string tag, hex;
  int version = 0;
  FileDigest d;
  if (!(in >> tag >> version >> d.bytes >> hex) || tag != "fsdpq-digest" || version != 1 || hex.size() != 16)
    fail("'{}' is not a digest file (expected one line 'fsdpq-digest 1 <bytes> <16 hex digits>')", path.string());
  d.hash = std::stoull(hex, nullptr, 16);
  return d;
}

}  // namespace fsdpq
