// Helpers shared by the checkpoint file tests: random tensors, slices of them, a temp folder all
// ranks agree on, and raw HDF5 access to damage files the way storage or people do.
#pragma once
#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>

#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "io/checkpoint_file.h"
#include "test_support.h"

namespace fsdpq::test {

// `n` random non-zero floats (zeros would hide a read that returns nothing).
inline std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
  std::vector<float> v(n);
  for (float& x : v) {
    x = dist(rng);
    if (x == 0.0f) x = 1.0f;
  }
  return v;
}

// Elements [begin, end) of `data`, as a slice.
inline FloatSlice slice_of(const std::vector<float>& data, int64_t begin, int64_t end) {
  return FloatSlice{begin, std::span<const float>(data.data() + begin, static_cast<size_t>(end - begin))};
}

inline int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// A fresh folder that every rank of `comm` uses: rank 0 makes it (and removes it at exit).
inline std::filesystem::path shared_temp_dir(MPI_Comm comm, const std::string& tag) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  std::string dir = rank == 0 ? make_temp_dir(tag).string() : std::string();
  int size = static_cast<int>(dir.size());
  MPI_Bcast(&size, 1, MPI_INT, 0, comm);
  dir.resize(static_cast<size_t>(size));
  MPI_Bcast(dir.data(), size, MPI_CHAR, 0, comm);
  return dir;
}

// Where the data of dataset `name` starts in the file (a contiguous dataset is one byte range).
inline int64_t dataset_file_offset(const std::filesystem::path& path, const std::string& name) {
  hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file < 0) throw std::runtime_error("cannot open " + path.string());
  hid_t dataset = H5Dopen2(file, name.c_str(), H5P_DEFAULT);
  haddr_t offset = dataset >= 0 ? H5Dget_offset(dataset) : HADDR_UNDEF;
  if (dataset >= 0) H5Dclose(dataset);
  H5Fclose(file);
  if (offset == HADDR_UNDEF) throw std::runtime_error("no data offset for dataset " + name);
  return static_cast<int64_t>(offset);
}

// Flips bits of one byte of the file, with plain stdio: what a bad disk or a stray write does.
inline void flip_byte(const std::filesystem::path& path, int64_t offset, unsigned char mask) {
  FILE* f = std::fopen(path.c_str(), "r+b");
  if (!f) throw std::runtime_error("cannot open " + path.string());
  unsigned char byte = 0;
  bool ok = std::fseek(f, offset, SEEK_SET) == 0 && std::fread(&byte, 1, 1, f) == 1;
  byte ^= mask;
  ok = ok && std::fseek(f, offset, SEEK_SET) == 0 && std::fwrite(&byte, 1, 1, f) == 1;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) throw std::runtime_error("cannot flip a byte of " + path.string());
}

// The same value on every rank: rank 0's, to compare one's own with.
inline std::string rank0_string(MPI_Comm comm, std::string text) {
  int size = static_cast<int>(text.size());
  MPI_Bcast(&size, 1, MPI_INT, 0, comm);
  text.resize(static_cast<size_t>(size));
  MPI_Bcast(text.data(), size, MPI_CHAR, 0, comm);
  return text;
}

}  // namespace fsdpq::test
