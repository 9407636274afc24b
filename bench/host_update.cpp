// The CPU-offload worker's two host passes, alone, at several OpenMP team sizes: what one unit's
// gradient accumulation (accumulate_and_sq_sum) and its fused AdamW update (scale, step, zero the
// gradient, store the bf16 compute copy) cost on this host, next to a STREAM-style triad that
// shows the memory bandwidth the same threads reach. It answers "is the offload update bound by
// memory, by arithmetic, or by too few threads?" (bench/RESULTS.md, "CPU offload").
//
//   fsdpq_host_update_bench [--units 32] [--unit_params 5000000] [--threads 1,2,4,8,16] [--reps 3]
//
// The default shape is Llama-2-7B QLoRA r64: 32 layer units of ~5M trainable parameters. All units'
// buffers are allocated (as the engine does) so each pass reads memory, not cache. Passes run on a
// thread of their own, as the engine's worker does (its OpenMP team is that thread's).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "optim/clip.h"
#include "optim/optimizer.h"
#include "util/dtype.h"

namespace {

struct Unit {
  std::vector<float> master, grad, staged;
  std::vector<uint16_t> compute;
  fsdpq::ShardOptimizer optimizer;
  Unit(int64_t n, const fsdpq::OptimizerConfig& config)
      : master(n), grad(n), staged(n), compute(n), optimizer(config, n) {}
};

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t comma = s.find(',', pos);
    const std::string item = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    const int v = std::atoi(item.c_str());
    if (v <= 0) throw std::runtime_error("--threads: expected positive integers separated by commas, got '" + s + "'");
    out.push_back(v);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Best-of-reps seconds for one pass over every unit (`pass(unit)`), per unit.
template <class Pass>
double per_unit_seconds(std::vector<Unit>& units, int reps, Pass pass) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (Unit& u : units) pass(u);
    best = std::min(best, seconds_since(t0));
  }
  return best / static_cast<double>(units.size());
}

void run(int units_count, int64_t n, const std::vector<int>& threads, int reps) {
  const fsdpq::OptimizerConfig config = fsdpq::optimizer_config("adamw", 1e-5, 0.1);
  std::vector<Unit> units;
  units.reserve(units_count);
  for (int i = 0; i < units_count; ++i) units.emplace_back(n, config);
  // Random-ish, non-zero values, touched once (first touch places the pages, as the engine's init does).
  for (Unit& u : units)
    for (int64_t i = 0; i < n; ++i) {
      const float x = static_cast<float>((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
      u.master[i] = x;
      u.staged[i] = x * 1e-3f;
    }
  const double N = static_cast<double>(n);
  std::printf("host update bench: %d units x %lld params (%.2f GB of fp32 master+grad+staged+state), %u cpus\n",
              units_count, static_cast<long long>(n), units_count * N * 6 * 4 / 1e9, std::thread::hardware_concurrency());
  std::printf("%8s %26s %26s %26s\n", "threads", "triad (GB/s)", "accumulate+sq ms (GB/s)", "adamw fused ms (GB/s, Gp/s)");
  for (int t : threads) {
    omp_set_num_threads(t);
    // a = b + s*c over (staged, grad, master): 12 bytes per element.
    const double triad = per_unit_seconds(units, reps, [&](Unit& u) {
      float* a = u.grad.data();
      const float* b = u.staged.data();
      const float* c = u.master.data();
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) a[i] = b[i] + 0.5f * c[i];
    });
    for (Unit& u : units) std::fill(u.grad.begin(), u.grad.end(), 0.0f);
    // grad += staged, sum of squares: reads staged and grad, writes grad (12 bytes per element).
    double sink = 0;
    const double accumulate = per_unit_seconds(units, reps, [&](Unit& u) {
      sink += fsdpq::accumulate_and_sq_sum(u.grad.data(), u.staged.data(), 1.0f, n);
    });
    // The engine's step_on_worker: reads master, grad, exp_avg, exp_avg_sq; writes master,
    // exp_avg, exp_avg_sq, grad (zeroed) and the bf16 copy: 34 bytes per element.
    const double update = per_unit_seconds(units, reps, [&](Unit& u) {
      fsdpq::StepFusion fusion;
      fusion.grad_scale = 0.9f;
      fusion.zero_grad = true;
      fusion.compute = u.compute.data();
      fusion.compute_dtype = fsdpq::DType::BF16;
      fusion.compute_numel = n;
      u.optimizer.step(u.master.data(), u.grad.data(), 1e-5, fusion);
    });
    std::printf("%8d %16.0f         %12.2f ms (%5.0f GB/s) %9.2f ms (%4.0f GB/s, %.2f Gp/s)%s\n", t, N * 12 / triad / 1e9,
                accumulate * 1e3, N * 12 / accumulate / 1e9, update * 1e3, N * 34 / update / 1e9, N / update / 1e9,
                sink == 0 ? " (zero sum?)" : "");
  }
}

}  // namespace

int main(int argc, char** argv) {
  int units = 32, reps = 3;
  int64_t n = 5'000'000;
  std::string threads = "1,2,4,8,12,16";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "fsdpq_host_update_bench: %s needs a value\n", a.c_str());
      return 2;
    }
    const std::string v = argv[++i];
    if (a == "--units") units = std::atoi(v.c_str());
    else if (a == "--unit_params") n = std::atoll(v.c_str());
    else if (a == "--threads") threads = v;
    else if (a == "--reps") reps = std::atoi(v.c_str());
    else {
      std::fprintf(stderr, "fsdpq_host_update_bench: unknown option %s (--units, --unit_params, --threads, --reps)\n",
                   a.c_str());
      return 2;
    }
  }
  if (units <= 0 || n <= 0 || reps <= 0) {
    std::fprintf(stderr, "fsdpq_host_update_bench: --units, --unit_params and --reps must be positive\n");
    return 2;
  }
  int rc = 0;
  std::thread worker([&] {  // as the engine's worker thread
    try {
      run(units, n, parse_list(threads), reps);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fsdpq_host_update_bench: %s\n", e.what());
      rc = 2;
    }
  });
  worker.join();
  return rc;
}
