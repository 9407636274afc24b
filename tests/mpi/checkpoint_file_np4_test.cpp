// Checkpoint files on 4 ranks: interleaved, uneven slices (some ranks write nothing) written
// collectively and read back at other rank counts; errors on some ranks reach all of them.
#include <gtest/gtest.h>
#include <mpi.h>

#include <filesystem>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/checkpoint_file.h"
#include "io/file_digest.h"
#include "mpi/checkpoint_test_support.h"
#include "test_support.h"

namespace fsdpq {
namespace {
namespace fs = std::filesystem;
using test::error_of;
using test::slice_of;

constexpr int kRanks = 4;

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

struct Range {
  int64_t begin, end;
};

// A tensor and, for every rank, the element ranges it writes.
struct ShardedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;                    // the whole tensor, the same on every rank
  std::vector<std::vector<Range>> by_rank;  // [rank] → ranges
};

// Cuts the tensor into pieces of 1..max_piece elements and deals them at random to `writers`
// (the same on every rank: fixed seeds).
ShardedTensor shard(std::string name, std::vector<int64_t> shape, const std::vector<int>& writers, int64_t max_piece,
                    uint32_t seed) {
  ShardedTensor t{std::move(name), std::move(shape), {}, std::vector<std::vector<Range>>(kRanks)};
  const int64_t n = test::numel_of(t.shape);
  t.data = test::random_floats(static_cast<size_t>(n), seed);
  std::mt19937 rng(seed + 1000);
  for (int64_t at = 0; at < n;) {
    const int64_t len = std::min(n - at, std::uniform_int_distribution<int64_t>(1, max_piece)(rng));
    const int owner = writers[std::uniform_int_distribution<size_t>(0, writers.size() - 1)(rng)];
    t.by_rank[static_cast<size_t>(owner)].push_back({at, at + len});
    at += len;
  }
  return t;
}

std::vector<ShardedTensor> sample_tensors() {
  return {
      shard("layers.0.attn.weight", {37, 11}, {0, 1, 3}, 40, 1),  // rank 2 writes none of it
      shard("layers.0.bias", {11}, {1}, 11, 2),                    // one rank writes all (replicated data)
      shard("norm", {}, {3}, 1, 3),                                // a scalar
      shard("embed", {50, 8}, {0, 1, 2, 3}, 25, 4),                // many small pieces everywhere
      shard("empty", {0}, {0}, 1, 5),                              // nothing to write
  };
}

// This rank's slices of `t`, last first: any order is allowed.
std::vector<FloatSlice> my_slices(const ShardedTensor& t, int rank) {
  std::vector<FloatSlice> slices;
  for (const Range& r : t.by_rank[static_cast<size_t>(rank)]) slices.push_back(slice_of(t.data, r.begin, r.end));
  std::reverse(slices.begin(), slices.end());
  return slices;
}

// Every rank reads every tensor whole and compares it with what was written.
void expect_contents(const CheckpointReader& reader, const std::vector<ShardedTensor>& tensors) {
  for (const ShardedTensor& t : tensors) {
    SCOPED_TRACE(t.name);
    ASSERT_TRUE(reader.has_tensor(t.name));
    EXPECT_EQ(reader.shape(t.name), t.shape);
    EXPECT_EQ(reader.stored_checksum(t.name), checksum_elements(0, t.data));
    std::vector<float> all(t.data.size());
    reader.read(t.name, 0, all);
    EXPECT_EQ(all, t.data);
  }
}

TEST(CheckpointFileMpi, InterleavedSlicesReadBackAtAnyRankCount) {
  ASSERT_EQ(kRanks, [] {
    int size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    return size;
  }());
  const int rank = world_rank();
  const fs::path path = test::shared_temp_dir(MPI_COMM_WORLD, "ckpt-np4") / "step-00000007.h5";
  const std::vector<ShardedTensor> tensors = sample_tensors();
  const nlohmann::json meta = {{"step", 7}, {"world_size", kRanks}};
  {
    // Small calls: ranks make very different numbers of them.
    CheckpointWriter writer(MPI_COMM_WORLD, path, /*max_io_elements=*/8);
    for (const ShardedTensor& t : tensors) writer.write_tensor(t.name, t.shape, my_slices(t, rank));
    // A rank's meta other than rank 0's is ignored.
    writer.commit(rank == 0 ? meta : nlohmann::json{{"ignored", rank}});
    EXPECT_TRUE(fs::exists(path));  // on every rank, once commit returns
    EXPECT_FALSE(fs::exists(writer.temp_path()));
  }

  {
    CheckpointReader reader(MPI_COMM_WORLD, path, /*max_io_elements=*/8);
    EXPECT_EQ(reader.meta(), meta);
    EXPECT_EQ(reader.tensor_names(),
              (std::vector<std::string>{"embed", "empty", "layers.0.attn.weight", "layers.0.bias", "norm"}));
    expect_contents(reader, tensors);
    EXPECT_NO_THROW(reader.verify());
  }
  {
    // Each rank alone, all at once.
    CheckpointReader reader(MPI_COMM_SELF, path);
    EXPECT_EQ(reader.meta(), meta);
    expect_contents(reader, tensors);
    EXPECT_NO_THROW(reader.verify());
  }
  {
    // Two groups of two ranks, each reading on its own.
    MPI_Comm pair;
    MPI_Comm_split(MPI_COMM_WORLD, rank / 2, rank, &pair);
    {
      CheckpointReader reader(pair, path, /*max_io_elements=*/5);
      expect_contents(reader, tensors);
      EXPECT_NO_THROW(reader.verify());
    }
    MPI_Comm_free(&pair);
  }
}

// The message each rank caught, compared with rank 0's: every rank must hold the same one.
void expect_same_everywhere(const std::string& message) {
  EXPECT_EQ(message, test::rank0_string(MPI_COMM_WORLD, message)) << "on rank " << world_rank();
}

template <class Error, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error of the expected type>";
}

TEST(CheckpointFileMpi, CoverageErrorsReachEveryRankAndLeaveTheWriterUsable) {
  const int rank = world_rank();
  const fs::path path = test::shared_temp_dir(MPI_COMM_WORLD, "ckpt-np4-coverage") / "c.h5";
  const std::vector<float> data = test::random_floats(8, 50);
  CheckpointWriter writer(MPI_COMM_WORLD, path);
  auto write = [&](const std::string& name, std::vector<int64_t> shape, std::vector<FloatSlice> slices) {
    writer.write_tensor(name, shape, slices);
  };
  auto on = [&](int r, std::vector<FloatSlice> slices) { return rank == r ? slices : std::vector<FloatSlice>{}; };

  // A gap: rank 2 forgets its part.
  std::string message = message_of<std::logic_error>([&] {
    std::vector<FloatSlice> mine = on(0, {slice_of(data, 0, 4)});
    if (rank == 1) mine = {slice_of(data, 4, 6)};
    write("gap", {8}, mine);
  });
  EXPECT_TRUE(contains(message, "tensor 'gap': the ranks' slices hold 6 elements in all")) << message;
  expect_same_everywhere(message);

  // An overlap that hides a gap of the same size: the counts add up, the index sums do not.
  message = message_of<std::logic_error>([&] {
    std::vector<FloatSlice> mine = on(0, {slice_of(data, 0, 4)});
    if (rank == 1) mine = {slice_of(data, 2, 6)};
    write("overlap", {8}, mine);
  });
  EXPECT_TRUE(contains(message, "tensor 'overlap': the ranks' slices overlap and leave a gap")) << message;
  expect_same_everywhere(message);

  // One rank's slice out of range: its message reaches the others.
  message = message_of<std::logic_error>([&] {
    std::vector<FloatSlice> mine = on(0, {slice_of(data, 0, 8)});
    if (rank == 3) mine = {FloatSlice{6, slice_of(data, 0, 4).values}};
    write("range", {8}, mine);
  });
  EXPECT_TRUE(contains(message, "rank 3's slice [6, 10) is outside its 8 elements")) << message;
  expect_same_everywhere(message);

  // Ranks that disagree on the shape (or name).
  message = message_of<std::logic_error>([&] {
    write("x", {rank == 1 ? 4 : 8}, on(0, {slice_of(data, 0, 8)}));
  });
  EXPECT_TRUE(contains(message, "on rank 1: rank 0 passes another name or shape")) << message;
  expect_same_everywhere(message);
  message = message_of<std::logic_error>([&] { write(rank == 2 ? "y" : "x", {8}, on(0, {slice_of(data, 0, 8)})); });
  EXPECT_TRUE(contains(message, "tensor 'y' of shape [8] on rank 2")) << message;
  expect_same_everywhere(message);

  // None of that left a trace: the writer goes on.
  write("ok", {8}, on(3, {slice_of(data, 0, 8)}));
  writer.commit({{"after", "errors"}});
  CheckpointReader reader(MPI_COMM_WORLD, path);
  EXPECT_EQ(reader.tensor_names(), std::vector<std::string>{"ok"});
  std::vector<float> out(8);
  reader.read("ok", 0, out);
  EXPECT_EQ(out, data);
  EXPECT_NO_THROW(reader.verify());
}

TEST(CheckpointFileMpi, UserErrorsOnOneRankReachEveryRank) {
  const fs::path dir = test::shared_temp_dir(MPI_COMM_WORLD, "ckpt-np4-errors");
  // Only rank 0 prepares the directory, so only rank 0 fails.
  if (world_rank() == 0) test::write_file(dir / "plain-file", "not a directory");
  MPI_Barrier(MPI_COMM_WORLD);
  std::string message = error_of([&] { CheckpointWriter writer(MPI_COMM_WORLD, dir / "plain-file" / "c.h5"); });
  EXPECT_TRUE(contains(message, "cannot create its directory '" + (dir / "plain-file").string() + "'")) << message;
  expect_same_everywhere(message);

  // Only rank 0 looks at the file before HDF5 opens it.
  message = error_of([&] { CheckpointReader reader(MPI_COMM_WORLD, dir / "missing.h5"); });
  EXPECT_EQ(message, "checkpoint '" + (dir / "missing.h5").string() + "' does not exist");
  expect_same_everywhere(message);
}

TEST(CheckpointFileMpi, RankZerosUnstorableMetaFailsCommitOnEveryRank) {
  const int rank = world_rank();
  const fs::path path = test::shared_temp_dir(MPI_COMM_WORLD, "ckpt-np4-meta") / "c.h5";
  const std::vector<float> data = test::random_floats(4, 60);
  CheckpointWriter writer(MPI_COMM_WORLD, path);
  writer.write_tensor("x", {4}, rank == 2 ? std::vector<FloatSlice>{slice_of(data, 0, 4)} : std::vector<FloatSlice>{});
  // Only rank 0's meta is stored, and only rank 0 turns it into text: invalid UTF-8 fails there.
  const nlohmann::json bad = rank == 0 ? nlohmann::json{{"note", std::string("\xff\xfe")}} : nlohmann::json{};
  const std::string message = message_of<std::logic_error>([&] { writer.commit(bad); });
  EXPECT_TRUE(contains(message, "meta cannot be stored as JSON text")) << message;
  expect_same_everywhere(message);
  EXPECT_FALSE(fs::exists(path));
  writer.commit({{"note", "fixed"}});  // nothing happened: it can still commit
  CheckpointReader reader(MPI_COMM_WORLD, path);
  EXPECT_EQ(reader.meta()["note"], "fixed");
  EXPECT_NO_THROW(reader.verify());
}

TEST(CheckpointFileMpi, CorruptionInOneRanksShareFailsVerifyOnEveryRank) {
  const int rank = world_rank();
  const fs::path path = test::shared_temp_dir(MPI_COMM_WORLD, "ckpt-np4-corrupt") / "c.h5";
  const std::vector<ShardedTensor> tensors = sample_tensors();
  {
    CheckpointWriter writer(MPI_COMM_WORLD, path);
    for (const ShardedTensor& t : tensors) writer.write_tensor(t.name, t.shape, my_slices(t, rank));
    writer.commit({});
  }
  // Element 390 of "embed" (400 elements) lies in the last rank's quarter of verify's reads.
  if (rank == 0) fs::remove(digest_path(path));  // verify() is under test, not the digest
  if (rank == 0) test::flip_byte(path, test::dataset_file_offset(path, "embed") + 4 * 390 + 3, 0x01);
  MPI_Barrier(MPI_COMM_WORLD);
  CheckpointReader reader(MPI_COMM_WORLD, path);
  const std::string message = error_of([&] { reader.verify(); });
  EXPECT_TRUE(contains(message, "checkpoint '" + path.string() + "': tensor 'embed' fails its checksum")) << message;
  expect_same_everywhere(message);
}

TEST(CheckpointFileMpi, UncommittedWriterRemovesItsTemporaryFileOnEveryRank) {
  const int rank = world_rank();
  const fs::path path = test::shared_temp_dir(MPI_COMM_WORLD, "ckpt-np4-uncommitted") / "c.h5";
  fs::path temp;
  {
    CheckpointWriter writer(MPI_COMM_WORLD, path);
    temp = writer.temp_path();
    const std::vector<ShardedTensor> tensors = sample_tensors();
    writer.write_tensor(tensors[0].name, tensors[0].shape, my_slices(tensors[0], rank));
    EXPECT_TRUE(fs::exists(temp));
  }
  EXPECT_FALSE(fs::exists(temp));  // on every rank: the destructor waits for the removal
  EXPECT_FALSE(fs::exists(path));
}

}  // namespace
}  // namespace fsdpq
