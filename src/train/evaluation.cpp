#include "train/evaluation.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "runtime/host_out_of_memory.h"
#include "runtime/watchdog.h"
#include "train/epoch_batches.h"
#include "train/exact_sum.h"

namespace fsdpq {

double evaluate_loss(LlamaModel& model, const std::vector<data::Example>& examples, int64_t batch_size,
                     int32_t pad_id, int64_t context_length, Communicator* world, bool padding_free) {
  const HostMemoryPurpose purpose("evaluating");
  const std::vector<data::Batch> batches =
      sequential_batches(examples, batch_size, pad_id, context_length, padding_free);
  const int64_t ranks = world ? world->size() : 1, rank = world ? world->rank() : 0;
  const int64_t n = static_cast<int64_t>(batches.size());
  // Batches go round-robin over the ranks; a rank without one in the last round runs batch 0
  // and discards it, so every rank makes the same passes (and the same gathers).
  ExactSum loss;  // the same bits whichever rank adds which batch
  int64_t tokens = 0;
  watchdog_phase("evaluating");
  for (int64_t round = 0; round * ranks < n; ++round) {
    const int64_t i = round * ranks + rank;
    watchdog_progress();
    LossSum l = model.evaluate(batches[static_cast<size_t>(i < n ? i : 0)]);
    if (i >= n) continue;
    loss.add(l.loss_sum);
    tokens += l.tokens;
  }
  int64_t sums[ExactSum::kValues + 1];
  std::copy_n(loss.data(), ExactSum::kValues, sums);
  sums[ExactSum::kValues] = tokens;
  if (world) world->all_reduce(sums, ExactSum::kValues + 1, CommType::I64, ReduceOp::Sum).wait();
  std::copy_n(sums, ExactSum::kValues, loss.data());
  tokens = sums[ExactSum::kValues];
  // A mean over no token is undefined, not 0 (JSON writes NaN as null).
  return tokens > 0 ? loss.value() / static_cast<double>(tokens) : std::nan("");
}

std::string describe_eval(double loss, const std::vector<data::Example>& examples) {
  size_t scored = 0;
  for (const data::Example& e : examples)
    scored += std::any_of(e.labels.begin() + (e.labels.empty() ? 0 : 1), e.labels.end(),
                          [](int32_t label) { return label != data::kIgnoreIndex; });
  const std::string left_out =
      scored < examples.size()
          ? fmt::format(" ({} of {} keep no target token after truncation and are left out)", examples.size() - scored,
                        examples.size())
          : "";
  if (scored == 0 || !std::isfinite(loss))
    return fmt::format("eval: no loss, no eval example keeps a target token after truncation{}", left_out);
  return fmt::format("eval loss {:.4f} (perplexity {:.2f}) on {} examples{}", loss, std::exp(loss), scored, left_out);
}

}  // namespace fsdpq
