// Checkpoint files on one rank: the checksum, round trips, commit and clean-up, the reader's
// validation of damaged and foreign files, and the checkpoint directory (latest marker, pruning).
#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/checkpoint_dir.h"
#include "io/checkpoint_file.h"
#include "io/file_digest.h"
#include "mpi/checkpoint_test_support.h"
#include "test_support.h"

namespace fsdpq {
namespace {
namespace fs = std::filesystem;
using test::error_of;
using test::random_floats;
using test::slice_of;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// ---- Checksum --------------------------------------------------------------------------------------

TEST(CheckpointChecksum, MatchesTheDocumentedFormula) {
  // Computed independently, in Python, from the formula in checkpoint_file.h.
  const float one[] = {1.0f};
  const float two[] = {1.0f, -2.5f};
  EXPECT_EQ(checksum_elements(0, one), 0x5a68661416272117ull);
  EXPECT_EQ(checksum_elements(5, two), 0x6d108b76fac5cb95ull);
  EXPECT_EQ(checksum_elements(3, {}), 0u);
}

TEST(CheckpointChecksum, SlicesAddUpToTheWhole) {
  const std::vector<float> data = random_floats(1000, 1);
  const uint64_t whole = checksum_elements(0, data);
  std::mt19937 rng(2);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<int64_t> cuts = {0, 1000};
    for (int i = 0; i < 5; ++i) cuts.push_back(std::uniform_int_distribution<int64_t>(0, 1000)(rng));
    std::sort(cuts.begin(), cuts.end());
    uint64_t sum = 0;
    for (size_t i = 1; i < cuts.size(); ++i) sum += checksum_elements(cuts[i - 1], slice_of(data, cuts[i - 1], cuts[i]).values);
    EXPECT_EQ(sum, whole);
  }
}

TEST(CheckpointChecksum, SeesAFlippedBitSwappedElementsAndAShift) {
  const std::vector<float> data = random_floats(1000, 3);
  const uint64_t whole = checksum_elements(0, data);
  for (int bit : {0, 22, 31}) {
    std::vector<float> flipped = data;
    uint32_t bits;
    std::memcpy(&bits, &flipped[17], 4);
    bits ^= 1u << bit;
    std::memcpy(&flipped[17], &bits, 4);
    EXPECT_NE(checksum_elements(0, flipped), whole) << "bit " << bit;
  }
  std::vector<float> swapped = data;
  ASSERT_NE(swapped[3], swapped[700]);
  std::swap(swapped[3], swapped[700]);
  EXPECT_NE(checksum_elements(0, swapped), whole);
  EXPECT_NE(checksum_elements(1, data), whole);  // the same values one position later
}

TEST(CheckpointChecksum, TempPathIsAHiddenSibling) {
  EXPECT_EQ(checkpoint_temp_path("/a/b/step-00000001.h5"), fs::path("/a/b/.step-00000001.h5.tmp"));
  EXPECT_EQ(checkpoint_temp_path("x.h5"), fs::path(".x.h5.tmp"));
}

// ---- Round trips -----------------------------------------------------------------------------------

struct TestTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};

std::vector<TestTensor> sample_tensors() {
  std::vector<TestTensor> tensors = {
      {"scalar", {}, {}}, {"vector", {7}, {}}, {"matrix", {13, 9}, {}}, {"empty", {0, 3}, {}}, {"big.weight", {3, 100}, {}},
  };
  uint32_t seed = 10;
  for (TestTensor& t : tensors) t.data = random_floats(static_cast<size_t>(test::numel_of(t.shape)), seed++);
  return tensors;
}

// Writes each tensor as three slices, last first (any order is allowed), and commits.
void write_sample(const fs::path& path, const std::vector<TestTensor>& tensors, const nlohmann::json& meta,
                  int64_t max_io_elements) {
  CheckpointWriter writer(MPI_COMM_WORLD, path, max_io_elements);
  for (const TestTensor& t : tensors) {
    const int64_t n = static_cast<int64_t>(t.data.size());
    const int64_t a = n / 3, b = 2 * n / 3;
    const FloatSlice slices[] = {slice_of(t.data, b, n), slice_of(t.data, a, b), slice_of(t.data, 0, a)};
    writer.write_tensor(t.name, t.shape, slices);
  }
  writer.commit(meta);
}

std::vector<float> read_all(const CheckpointReader& reader, const std::string& name) {
  std::vector<float> out(static_cast<size_t>(reader.numel(name)));
  reader.read(name, 0, out);
  return out;
}

TEST(CheckpointFile, RoundTripsTensorsShapesAndMeta) {
  const fs::path dir = test::make_temp_dir("ckpt-roundtrip");
  const fs::path path = dir / "step-00000003.h5";
  const std::vector<TestTensor> tensors = sample_tensors();
  const nlohmann::json meta = {{"step", 3}, {"optimizer", {{"name", "adamw"}, {"lr", 1e-4}}}, {"names", {"a", "b"}}};
  write_sample(path, tensors, meta, /*max_io_elements=*/16);  // big.weight's slices take 7 calls each
  EXPECT_TRUE(fs::exists(path));
  EXPECT_FALSE(fs::exists(checkpoint_temp_path(path)));

  CheckpointReader reader(MPI_COMM_WORLD, path, /*max_io_elements=*/16);
  EXPECT_EQ(reader.meta(), meta);
  EXPECT_EQ(reader.tensor_names(), (std::vector<std::string>{"big.weight", "empty", "matrix", "scalar", "vector"}));
  for (const TestTensor& t : tensors) {
    SCOPED_TRACE(t.name);
    EXPECT_TRUE(reader.has_tensor(t.name));
    EXPECT_EQ(reader.shape(t.name), t.shape);
    EXPECT_EQ(reader.numel(t.name), static_cast<int64_t>(t.data.size()));
    EXPECT_EQ(reader.stored_checksum(t.name), checksum_elements(0, t.data));
    EXPECT_EQ(read_all(reader, t.name), t.data);
  }
  EXPECT_EQ(reader.numel("scalar"), 1);
  EXPECT_FALSE(reader.has_tensor("missing"));

  // A range across several max_io_elements pieces, and an empty one at the very end.
  const std::vector<float>& big = tensors[4].data;
  std::vector<float> part(245);
  reader.read("big.weight", 5, part);
  EXPECT_EQ(part, std::vector<float>(big.begin() + 5, big.begin() + 250));
  std::vector<float> none;
  EXPECT_NO_THROW(reader.read("big.weight", 300, none));
  EXPECT_NO_THROW(reader.verify());
}

TEST(CheckpointFile, StoresAMetaLargerThanAnHdf5HeaderMessage) {
  const fs::path path = test::make_temp_dir("ckpt-bigmeta") / "c.h5";
  const nlohmann::json meta = {{"history", std::string(300000, 'x')}, {"step", 1}};
  write_sample(path, sample_tensors(), meta, kMaxIoElements);
  CheckpointReader reader(MPI_COMM_WORLD, path);
  EXPECT_EQ(reader.meta(), meta);
}

TEST(CheckpointFile, CommitReplacesAnOlderFileOfTheSameName) {
  const fs::path path = test::make_temp_dir("ckpt-replace") / "c.h5";
  const std::vector<float> first = random_floats(20, 20), second = random_floats(20, 21);
  for (const auto* data : {&first, &second}) {
    CheckpointWriter writer(MPI_COMM_WORLD, path);
    const FloatSlice all[] = {slice_of(*data, 0, 20)};
    writer.write_tensor("x", {4, 5}, all);
    writer.commit({{"which", data == &first ? 1 : 2}});
  }
  CheckpointReader reader(MPI_COMM_WORLD, path);
  EXPECT_EQ(reader.meta()["which"], 2);
  EXPECT_EQ(read_all(reader, "x"), second);
}

TEST(CheckpointFile, CreatesMissingDirectories) {
  const fs::path path = test::make_temp_dir("ckpt-mkdir") / "run" / "checkpoints" / "c.h5";
  write_sample(path, sample_tensors(), nlohmann::json::object(), kMaxIoElements);
  EXPECT_TRUE(fs::is_regular_file(path));
}

TEST(CheckpointFile, UnusableDirectoryIsAUserErrorNamingIt) {
  const fs::path dir = test::make_temp_dir("ckpt-baddir");
  test::write_file(dir / "plain-file", "not a directory");
  const fs::path path = dir / "plain-file" / "c.h5";
  const std::string error = error_of([&] { CheckpointWriter writer(MPI_COMM_WORLD, path); });
  EXPECT_TRUE(contains(error, (dir / "plain-file").string())) << error;
  EXPECT_TRUE(contains(error, "cannot create its directory")) << error;
}

TEST(CheckpointFile, UncommittedWriterLeavesNoFile) {
  const fs::path dir = test::make_temp_dir("ckpt-uncommitted");
  const fs::path path = dir / "c.h5";
  const std::string stale = "stale bytes of an interrupted write";
  test::write_file(checkpoint_temp_path(path), stale);
  {
    CheckpointWriter writer(MPI_COMM_WORLD, path);
    EXPECT_EQ(writer.temp_path(), checkpoint_temp_path(path));
    EXPECT_TRUE(fs::exists(writer.temp_path()));
    EXPECT_NE(test::read_file(writer.temp_path()), stale);  // replaced by the new write
    const std::vector<float> data = random_floats(10, 30);
    const FloatSlice all[] = {slice_of(data, 0, 10)};
    writer.write_tensor("x", {10}, all);
    EXPECT_FALSE(fs::exists(path));
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(checkpoint_temp_path(path)));
  EXPECT_TRUE(fs::is_empty(dir));
}

TEST(CheckpointFile, ForeignExceptionStillRemovesTheTemporaryFile) {
  const fs::path path = test::make_temp_dir("ckpt-foreign") / "c.h5";
  try {
    CheckpointWriter writer(MPI_COMM_WORLD, path);
    throw std::runtime_error("the trainer failed");
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "the trainer failed");
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(checkpoint_temp_path(path)));
}

TEST(CheckpointFile, CallerBugsAreLogicErrorsAndLeaveTheWriterUsable) {
  const fs::path path = test::make_temp_dir("ckpt-logic") / "c.h5";
  const std::vector<float> data = random_floats(10, 40);
  CheckpointWriter writer(MPI_COMM_WORLD, path);
  auto write = [&](const std::string& name, std::vector<int64_t> shape, std::vector<FloatSlice> slices) {
    writer.write_tensor(name, shape, slices);
  };
  EXPECT_THROW(write("gap", {10}, {slice_of(data, 0, 4), slice_of(data, 5, 10)}), std::logic_error);
  EXPECT_THROW(write("overlap", {10}, {slice_of(data, 0, 6), slice_of(data, 5, 10)}), std::logic_error);
  EXPECT_THROW(write("too-long", {9}, {slice_of(data, 0, 10)}), std::logic_error);
  EXPECT_THROW(write("negative", {10}, {FloatSlice{-1, slice_of(data, 0, 10).values}}), std::logic_error);
  EXPECT_THROW(write("bad-shape", {-2, -5}, {slice_of(data, 0, 10)}), std::logic_error);
  EXPECT_THROW(write("", {10}, {slice_of(data, 0, 10)}), std::logic_error);
  EXPECT_THROW(write("a/b", {10}, {slice_of(data, 0, 10)}), std::logic_error);
  EXPECT_THROW(write(".", {10}, {slice_of(data, 0, 10)}), std::logic_error);
  try {
    write("gap", {10}, {slice_of(data, 0, 9)});
    FAIL() << "a gap must be a logic_error";
  } catch (const std::logic_error& e) {
    EXPECT_TRUE(contains(e.what(), "tensor 'gap'")) << e.what();
    EXPECT_TRUE(contains(e.what(), "9 elements")) << e.what();
  }

  write("ok", {2, 5}, {slice_of(data, 5, 10), slice_of(data, 0, 5)});
  EXPECT_THROW(write("ok", {2, 5}, {slice_of(data, 0, 10)}), std::logic_error);  // twice
  writer.commit({{"fine", true}});
  EXPECT_THROW(write("late", {10}, {slice_of(data, 0, 10)}), std::logic_error);
  EXPECT_THROW(writer.commit({}), std::logic_error);

  CheckpointReader reader(MPI_COMM_WORLD, path);
  EXPECT_EQ(reader.tensor_names(), std::vector<std::string>{"ok"});
  EXPECT_EQ(read_all(reader, "ok"), data);
  EXPECT_NO_THROW(reader.verify());
}

// ---- The reader's validation -----------------------------------------------------------------------

// A committed sample checkpoint in a fresh folder.
fs::path committed_sample(const std::string& tag) {
  const fs::path path = test::make_temp_dir(tag) / "step-00000001.h5";
  write_sample(path, sample_tensors(), {{"step", 1}}, kMaxIoElements);
  return path;
}

std::string open_error(const fs::path& path) {
  return error_of([&] { CheckpointReader reader(MPI_COMM_WORLD, path); });
}

// The whole-file digest written at commit catches damage anywhere, before HDF5 reads a byte.
TEST(CheckpointDigest, CommittedFilesCarryOneThatCatchesAnyChange) {
  const fs::path path = committed_sample("digest");
  ASSERT_TRUE(fs::exists(digest_path(path)));
  ASSERT_EQ(read_digest(path), digest_file(path));
  EXPECT_EQ(open_error(path), "<no error>");
  for (int64_t where : {int64_t{0} + 100, static_cast<int64_t>(fs::file_size(path)) / 2,
                        static_cast<int64_t>(fs::file_size(path)) - 1}) {
    const fs::path copy = path.parent_path() / "copy.h5";
    fs::copy_file(path, copy, fs::copy_options::overwrite_existing);
    fs::copy_file(digest_path(path), digest_path(copy), fs::copy_options::overwrite_existing);
    test::flip_byte(copy, where, 0x04);
    EXPECT_TRUE(contains(open_error(copy), "is corrupt: its bytes no longer match the digest written with it"))
        << where << ": " << open_error(copy);
  }
  const fs::path cut = path.parent_path() / "cut.h5";
  fs::copy_file(path, cut);
  fs::copy_file(digest_path(path), digest_path(cut));
  fs::resize_file(cut, fs::file_size(path) - 8);
  EXPECT_TRUE(contains(open_error(cut), "is corrupt: it has")) << open_error(cut);
  test::write_file(digest_path(cut), "nonsense\n");
  EXPECT_TRUE(contains(open_error(cut), "is not a digest file")) << open_error(cut);
}

// Opens the file with serial HDF5 and lets `edit` change it, as another tool would. The file's
// digest would catch any edit before HDF5 opens it; these tests are about the checks below it,
// so the digest goes (a file another tool wrote has none).
void edit_hdf5(const fs::path& path, const std::function<void(hid_t root)>& edit) {
  fs::remove(digest_path(path));
  hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(file, 0) << path;
  edit(file);
  ASSERT_GE(H5Fclose(file), 0);
}

void delete_attribute(hid_t object, const char* name) { ASSERT_GE(H5Adelete(object, name), 0) << name; }

void put_string_attribute(hid_t object, const char* name, const std::string& text) {
  if (H5Aexists(object, name) > 0) delete_attribute(object, name);
  hid_t type = H5Tcopy(H5T_C_S1);
  H5Tset_size(type, text.size());
  hid_t space = H5Screate(H5S_SCALAR);
  hid_t attribute = H5Acreate2(object, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(attribute, 0);
  ASSERT_GE(H5Awrite(attribute, type, text.data()), 0);
  H5Aclose(attribute);
  H5Sclose(space);
  H5Tclose(type);
}

void put_int64_attribute(hid_t object, const char* name, const std::vector<int64_t>& values) {
  if (H5Aexists(object, name) > 0) delete_attribute(object, name);
  const hsize_t n = values.size();
  hid_t space = H5Screate_simple(1, &n, nullptr);
  hid_t attribute = H5Acreate2(object, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(attribute, 0);
  ASSERT_GE(H5Awrite(attribute, H5T_NATIVE_INT64, values.data()), 0);
  H5Aclose(attribute);
  H5Sclose(space);
}

// A dataset of `type` and `dims` holding zeros, with a 'shape' and 'checksum' as fsdpq writes them.
void put_dataset(hid_t root, const char* name, hid_t type, const std::vector<hsize_t>& dims) {
  hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  hid_t dataset = H5Dcreate2(root, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(dataset, 0);
  std::vector<int64_t> shape(dims.begin(), dims.end());
  put_int64_attribute(dataset, "shape", shape);
  put_int64_attribute(dataset, "checksum", {0});
  H5Dclose(dataset);
  H5Sclose(space);
}

TEST(CheckpointReaderErrors, MissingFile) {
  const fs::path path = test::make_temp_dir("ckpt-missing") / "nope.h5";
  const std::string error = open_error(path);
  EXPECT_EQ(error, "checkpoint '" + path.string() + "' does not exist");
}

TEST(CheckpointReaderErrors, EmptyFile) {
  const fs::path path = test::make_temp_dir("ckpt-empty") / "empty.h5";
  test::write_file(path, "");
  const std::string error = open_error(path);
  EXPECT_TRUE(contains(error, path.string())) << error;
  EXPECT_TRUE(contains(error, "is empty")) << error;
}

TEST(CheckpointReaderErrors, TextFile) {
  const fs::path path = test::make_temp_dir("ckpt-text") / "notes.h5";
  test::write_file(path, "step 5 looked fine\n");
  const std::string error = open_error(path);
  EXPECT_TRUE(contains(error, path.string())) << error;
  EXPECT_TRUE(contains(error, "not an HDF5 file")) << error;
}

TEST(CheckpointReaderErrors, TruncatedFile) {
  const fs::path original = committed_sample("ckpt-truncated");
  const fs::path path = original.parent_path() / "cut.h5";
  fs::copy_file(original, path);
  fs::resize_file(path, fs::file_size(original) / 2);
  const std::string error = open_error(path);
  EXPECT_TRUE(contains(error, path.string())) << error;
  EXPECT_TRUE(contains(error, "truncated file")) << error;  // HDF5's own finding, passed on
}

TEST(CheckpointReaderErrors, Hdf5FileWithoutTheFormatAttributes) {
  const fs::path path = test::make_temp_dir("ckpt-foreign-hdf5") / "other.h5";
  hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  put_dataset(file, "x", H5T_IEEE_F32LE, {4});
  H5Fclose(file);
  const std::string error = open_error(path);
  EXPECT_TRUE(contains(error, path.string())) << error;
  EXPECT_TRUE(contains(error, "no 'format' attribute")) << error;
}

TEST(CheckpointReaderErrors, OtherFormatOrVersion) {
  const fs::path path = committed_sample("ckpt-version");
  edit_hdf5(path, [](hid_t root) { put_string_attribute(root, "format", "someone-elses-format"); });
  EXPECT_TRUE(contains(open_error(path), "its format is 'someone-elses-format'")) << open_error(path);
  edit_hdf5(path, [](hid_t root) {
    put_string_attribute(root, "format", kCheckpointFormat);
    put_int64_attribute(root, "format_version", {2});
  });
  EXPECT_TRUE(contains(open_error(path), "format_version 2 is not one this fsdpq reads")) << open_error(path);
  edit_hdf5(path, [](hid_t root) { delete_attribute(root, "format_version"); });
  EXPECT_TRUE(contains(open_error(path), "'format_version'")) << open_error(path);
}

TEST(CheckpointReaderErrors, MetaThatIsNotJson) {
  const fs::path path = committed_sample("ckpt-meta");
  edit_hdf5(path, [](hid_t root) { put_string_attribute(root, "meta", "{\"step\": 1,"); });
  const std::string error = open_error(path);
  EXPECT_TRUE(contains(error, path.string())) << error;
  EXPECT_TRUE(contains(error, "'meta' attribute is not valid JSON")) << error;
  edit_hdf5(path, [](hid_t root) { delete_attribute(root, "meta"); });
  EXPECT_TRUE(contains(open_error(path), "no 'meta' attribute")) << open_error(path);
}

TEST(CheckpointReaderErrors, DatasetsThatAreNotFlatFloat32) {
  const fs::path path = committed_sample("ckpt-datasets");
  const fs::path two_d = path.parent_path() / "two-d.h5", ints = path.parent_path() / "ints.h5";
  fs::copy_file(path, two_d);
  fs::copy_file(path, ints);
  edit_hdf5(two_d, [](hid_t root) { put_dataset(root, "grid", H5T_IEEE_F32LE, {2, 3}); });
  std::string error = open_error(two_d);
  EXPECT_TRUE(contains(error, "tensor 'grid': its dataset is not 1-D")) << error;
  edit_hdf5(ints, [](hid_t root) { put_dataset(root, "counts", H5T_STD_I32LE, {6}); });
  error = open_error(ints);
  EXPECT_TRUE(contains(error, "tensor 'counts': its dataset is not float32")) << error;
}

TEST(CheckpointReaderErrors, ShapeOrChecksumMissingOrWrong) {
  const fs::path path = committed_sample("ckpt-attrs");
  edit_hdf5(path, [](hid_t root) {
    hid_t dataset = H5Dopen2(root, "matrix", H5P_DEFAULT);
    put_int64_attribute(dataset, "shape", {13, 8});
    H5Dclose(dataset);
  });
  std::string error = open_error(path);
  EXPECT_TRUE(contains(error, "tensor 'matrix': its shape [13, 8] does not match the 117 elements")) << error;
  edit_hdf5(path, [](hid_t root) {
    hid_t dataset = H5Dopen2(root, "matrix", H5P_DEFAULT);
    delete_attribute(dataset, "shape");
    H5Dclose(dataset);
  });
  error = open_error(path);
  EXPECT_TRUE(contains(error, "tensor 'matrix': has no 'shape' attribute")) << error;
  edit_hdf5(path, [](hid_t root) {
    hid_t dataset = H5Dopen2(root, "matrix", H5P_DEFAULT);
    put_int64_attribute(dataset, "shape", {13, 9});
    delete_attribute(dataset, "checksum");
    H5Dclose(dataset);
  });
  error = open_error(path);
  EXPECT_TRUE(contains(error, "tensor 'matrix': has no 'checksum' attribute")) << error;
}

TEST(CheckpointReaderErrors, FlippedByteFailsVerifyNamingTheTensor) {
  const fs::path path = committed_sample("ckpt-flip");
  {
    CheckpointReader reader(MPI_COMM_WORLD, path);
    EXPECT_NO_THROW(reader.verify());
  }
  const std::vector<float> original = sample_tensors()[2].data;  // "matrix"
  fs::remove(digest_path(path));  // the digest would catch it first: this test is about verify()
  test::flip_byte(path, test::dataset_file_offset(path, "matrix") + 4 * 50 + 1, 0x10);
  CheckpointReader reader(MPI_COMM_WORLD, path);  // the metadata is intact: it opens
  std::vector<float> value(1);
  reader.read("matrix", 50, value);
  EXPECT_NE(value[0], original[50]);
  const std::string error = error_of([&] { reader.verify(); });
  EXPECT_TRUE(contains(error, "checkpoint '" + path.string() + "': tensor 'matrix' fails its checksum")) << error;
  EXPECT_TRUE(contains(error, "the file is corrupt")) << error;
}

TEST(CheckpointReaderErrors, UnknownTensorsAndRangesOutsideOne) {
  const fs::path path = committed_sample("ckpt-names");
  CheckpointReader reader(MPI_COMM_WORLD, path);
  std::string error = error_of([&] { reader.shape("matrx"); });
  EXPECT_TRUE(contains(error, path.string())) << error;
  EXPECT_TRUE(contains(error, "has no tensor 'matrx' (did you mean 'matrix'?)")) << error;
  EXPECT_TRUE(contains(error_of([&] { reader.numel("nothing-like-it"); }), "has no tensor 'nothing-like-it'"));
  EXPECT_TRUE(contains(error_of([&] { reader.stored_checksum("x"); }), "has no tensor 'x'"));
  std::vector<float> out(10);
  EXPECT_TRUE(contains(error_of([&] { reader.read("nope", 0, out); }), "has no tensor 'nope'"));
  error = error_of([&] { reader.read("vector", 0, out); });  // 10 of 7
  EXPECT_TRUE(contains(error, "tensor 'vector': elements [0, 10) are outside its 7 elements")) << error;
  error = error_of([&] { reader.read("matrix", -1, std::span<float>(out).first(2)); });
  EXPECT_TRUE(contains(error, "tensor 'matrix': elements [-1, 1) are outside")) << error;
  error = error_of([&] { reader.read("matrix", 116, std::span<float>(out).first(2)); });
  EXPECT_TRUE(contains(error, "elements [116, 118) are outside its 117 elements")) << error;
}

// ---- The checkpoint directory ----------------------------------------------------------------------

TEST(CheckpointDir, FileNamesAndSteps) {
  EXPECT_EQ(checkpoint_file_name(42), "step-00000042.h5");
  EXPECT_EQ(checkpoint_file_name(0), "step-00000000.h5");
  EXPECT_EQ(checkpoint_file_name(123456789), "step-123456789.h5");
  EXPECT_THROW(checkpoint_file_name(-1), std::logic_error);
  EXPECT_EQ(checkpoint_step("step-00000042.h5"), 42);
  EXPECT_EQ(checkpoint_step("step-7.h5"), 7);
  for (const char* bad : {"step-.h5", "step--1.h5", "step-+1.h5", "step-1a.h5", "step-1.h5.tmp", ".step-1.h5.tmp",
                          "step-1.h5x", "Step-1.h5", "step-1", "latest"})
    EXPECT_FALSE(checkpoint_step(bad).has_value()) << bad;
}

// Creates empty files (and folders, for names ending in '/') in `dir`.
void touch_all(const fs::path& dir, const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    if (name.back() == '/') fs::create_directories(dir / name);
    else test::write_file(dir / name, "x");
  }
}

TEST(CheckpointDir, LatestIsTheHighestCompleteStep) {
  const fs::path dir = test::make_temp_dir("ckpt-dir-latest");
  EXPECT_EQ(find_latest_checkpoint(dir / "missing"), std::nullopt);
  EXPECT_EQ(find_latest_checkpoint(dir), std::nullopt);
  touch_all(dir, {".step-99999999.h5.tmp", "step-abc.h5", "step-00000012.h5.partial", "notes.txt", "step-99999998.h5/"});
  EXPECT_EQ(find_latest_checkpoint(dir), std::nullopt);
  touch_all(dir, {"step-00000001.h5", "step-00000010.h5", "step-00000009.h5"});
  EXPECT_EQ(find_latest_checkpoint(dir), dir / "step-00000010.h5");
  touch_all(dir, {"step-99999997.h5", "step-123456789.h5"});  // by number, not by name
  EXPECT_EQ(find_latest_checkpoint(dir), dir / "step-123456789.h5");
}

TEST(CheckpointDir, TheMarkerWinsWhileItsFileExists) {
  const fs::path dir = test::make_temp_dir("ckpt-dir-marker");
  touch_all(dir, {"step-00000001.h5", "step-00000002.h5", "step-00000003.h5"});
  mark_latest(dir, "step-00000002.h5");
  EXPECT_EQ(test::read_file(dir / kLatestMarkerName), "step-00000002.h5\n");
  EXPECT_FALSE(fs::exists(dir / ".latest.tmp"));
  EXPECT_EQ(find_latest_checkpoint(dir), dir / "step-00000002.h5");
  mark_latest(dir, "step-00000001.h5");  // replaces the old marker
  EXPECT_EQ(find_latest_checkpoint(dir), dir / "step-00000001.h5");
  fs::remove(dir / "step-00000001.h5");
  EXPECT_EQ(find_latest_checkpoint(dir), dir / "step-00000003.h5");  // it names a lost file
  test::write_file(dir / kLatestMarkerName, "../elsewhere.h5\n");
  EXPECT_EQ(find_latest_checkpoint(dir), dir / "step-00000003.h5");
  EXPECT_THROW(mark_latest(dir, "a/b.h5"), std::logic_error);
  EXPECT_THROW(mark_latest(dir, ""), std::logic_error);
  const std::string error = error_of([&] { mark_latest(dir / "missing", "step-00000003.h5"); });
  EXPECT_TRUE(contains(error, (dir / "missing" / ".latest.tmp").string())) << error;
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(CheckpointDir, PruningKeepsTheNewestTheProtectedAndTheMarked) {
  const fs::path dir = test::make_temp_dir("ckpt-dir-prune");
  EXPECT_TRUE(prune_checkpoints(dir / "missing", 2, "").empty());
  touch_all(dir, {"step-00000001.h5", "step-00000002.h5", "step-00000003.h5", "step-00000005.h5", "step-00000010.h5",
                  ".step-00000004.h5.tmp", ".step-00000011.h5.tmp", "notes.txt", "step-00000000.h5.partial"});
  mark_latest(dir, "step-00000002.h5");
  const std::vector<fs::path> removed = prune_checkpoints(dir, 2, "step-00000001.h5");
  EXPECT_EQ(removed, (std::vector<fs::path>{dir / "step-00000003.h5", dir / ".step-00000004.h5.tmp"}));
  EXPECT_EQ(names_in(dir), (std::vector<std::string>{".step-00000011.h5.tmp", "latest", "notes.txt", "step-00000000.h5.partial",
                                                     "step-00000001.h5", "step-00000002.h5", "step-00000005.h5",
                                                     "step-00000010.h5"}));
  // The marked newest counts as one of the newest.
  mark_latest(dir, "step-00000010.h5");
  EXPECT_EQ(prune_checkpoints(dir, 1, ""),
            (std::vector<fs::path>{dir / "step-00000001.h5", dir / "step-00000002.h5", dir / "step-00000005.h5"}));
  EXPECT_TRUE(prune_checkpoints(dir, 1, "").empty());
}

TEST(CheckpointDir, KeepAllStillRemovesStaleTemporaries) {
  const fs::path dir = test::make_temp_dir("ckpt-dir-keepall");
  touch_all(dir, {"step-00000001.h5", "step-00000003.h5", ".step-00000002.h5.tmp", ".step-00000003.h5.tmp"});
  EXPECT_EQ(prune_checkpoints(dir, 0, ""), std::vector<fs::path>{dir / ".step-00000002.h5.tmp"});
  EXPECT_EQ(names_in(dir), (std::vector<std::string>{".step-00000003.h5.tmp", "step-00000001.h5", "step-00000003.h5"}));
}

}  // namespace
}  // namespace fsdpq
