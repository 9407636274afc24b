// What a person watching the run sees (rank 0 only): on a terminal with log_to = tqdm, one
// progress line redrawn in place (step, loss, lr, tokens/s, ETA); otherwise (stdout, or tqdm
// when not a terminal) one plain line per step; with log_to = file, lines go to
// output_dir/train.log only.
#pragma once
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

namespace fsdpq {

struct StepReport {
  int64_t step = 0;  // 1-based, after the optimizer step
  int64_t total_steps = 0;
  int64_t epoch = 0;
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  double tokens_per_second = 0;
  double eval_loss = -1;  // < 0: none this step
  bool skipped = false;   // fp16: the gradients overflowed, the optimizer step was skipped
};

class Progress {
 public:
  Progress() = default;  // silent (ranks other than 0)
  Progress(const std::string& log_to, const std::filesystem::path& output_dir);
  ~Progress();
  Progress(Progress&&) noexcept;
  Progress& operator=(Progress&&) noexcept;

  void step(const StepReport& report);
  // A line that is not a step (eval results, saved files); keeps the bar intact.
  void message(const std::string& text);
  void finish();

 private:
  void emit_line(const std::string& text);
  bool enabled_ = false;
  bool bar_ = false;
  std::FILE* log_file_ = nullptr;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  bool bar_drawn_ = false;
};

std::string format_duration(double seconds);

}  // namespace fsdpq
