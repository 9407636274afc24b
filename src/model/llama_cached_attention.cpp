#include "model/llama_cached_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ops/checks.h"
#include "ops/parallel.h"
#include "ops/storage.h"

namespace fsdpq {

void cached_attention_forward(TensorView out, const TensorView& q, const TensorView& keys, const TensorView& values,
                              int64_t start) {
  constexpr const char* op = "cached_attention_forward";
  check_cpu_float(op, "q", q);
  check_cpu_float(op, "out", out);
  check_cpu_float(op, "keys", keys);
  check_cpu_float(op, "values", values);
  check_that(q.shape.rank == 3 && keys.shape.rank == 3, "{}: q {} must be [n, H, D] and keys {} [max, KV, D]", op,
             q.shape.to_string(), keys.shape.to_string());
  const int64_t n = q.shape[0], H = q.shape[1], D = q.shape[2], KV = keys.shape[1];
  check_shape(op, "out", out, q.shape);
  check_shape(op, "values", values, keys.shape);
  check_that(keys.shape[2] == D && KV > 0 && H % KV == 0, "{}: q {} and keys {} do not fit", op, q.shape.to_string(),
             keys.shape.to_string());
  check_that(keys.dtype == values.dtype, "{}: keys and values must share a dtype", op);
  check_that(start >= 0 && start + n <= keys.shape[0], "{}: tokens {}..{} do not fit the cache of {}", op, start,
             start + n, keys.shape[0]);
  const int64_t group = H / KV, context = start + n;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));

  with_storages({q.dtype, keys.dtype, out.dtype}, op, [&](auto q_tag, auto kv_tag, auto out_tag) {
    using QS = decltype(q_tag);
    using KS = decltype(kv_tag);
    using OS = decltype(out_tag);
    const QS* qd = q.as<const QS>();
    const KS* kd = keys.as<const KS>();
    const KS* vd = values.as<const KS>();
    OS* od = out.as<OS>();
#pragma omp parallel if (worth_parallel(n * H * context * D))
    {
      std::vector<float> scores(static_cast<size_t>(context)), acc(static_cast<size_t>(D));
#pragma omp for schedule(static)
      for (int64_t task = 0; task < n * H; ++task) {
        const int64_t t = task / H, h = task % H, kvh = h / group, visible = start + t + 1;
        const QS* qrow = qd + (t * H + h) * D;
        float max_score = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < visible; ++j) {
          const KS* krow = kd + (j * KV + kvh) * D;
          float dot = 0.0f;
          for (int64_t i = 0; i < D; ++i) dot += to_f32(qrow[i]) * to_f32(krow[i]);
          scores[static_cast<size_t>(j)] = dot * scale;
          max_score = std::max(max_score, scores[static_cast<size_t>(j)]);
        }
        float sum = 0.0f;
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t j = 0; j < visible; ++j) {
          const float p = std::exp(scores[static_cast<size_t>(j)] - max_score);
          sum += p;
          const KS* vrow = vd + (j * KV + kvh) * D;
          for (int64_t i = 0; i < D; ++i) acc[static_cast<size_t>(i)] += p * to_f32(vrow[i]);
        }
        OS* orow = od + (t * H + h) * D;
        for (int64_t i = 0; i < D; ++i) orow[i] = from_f32<OS>(acc[static_cast<size_t>(i)] / sum);
      }
    }
  });
}

}  // namespace fsdpq
