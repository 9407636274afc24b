#include "train/progress.h"

#include <cerrno>
#include <cstring>
#include <fmt/format.h>
#include <unistd.h>

#include <cmath>

#include <utility>

#include "util/error.h"

namespace fsdpq {

std::string format_duration(double seconds) {
  if (seconds < 0 || seconds > 1e8) return "?";
  auto s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60);
  return fmt::format("{}:{:02}", s / 60, s % 60);
}

Progress::Progress(const std::string& log_to, const std::filesystem::path& output_dir) : enabled_(true) {
  if (log_to == "file") {
    std::error_code ec;
    std::filesystem::create_directories(output_dir, ec);
    auto path = output_dir / "train.log";
    log_file_ = std::fopen(path.c_str(), "ab");
    if (!log_file_) fail("cannot write the log file '{}': {}", path.string(), std::strerror(errno));
  }
  bar_ = log_to == "tqdm" && isatty(STDOUT_FILENO);
}

Progress::~Progress() {
  if (log_file_) std::fclose(log_file_);
}

Progress::Progress(Progress&& o) noexcept
    : enabled_(o.enabled_), bar_(o.bar_), log_file_(std::exchange(o.log_file_, nullptr)), start_(o.start_),
      bar_drawn_(o.bar_drawn_) {}

Progress& Progress::operator=(Progress&& o) noexcept {
  if (this != &o) {
    if (log_file_) std::fclose(log_file_);
    enabled_ = o.enabled_;
    bar_ = o.bar_;
    log_file_ = std::exchange(o.log_file_, nullptr);
    start_ = o.start_;
    bar_drawn_ = o.bar_drawn_;
  }
  return *this;
}

void Progress::emit_line(const std::string& text) {
  if (log_file_) {
    std::fputs((text + "\n").c_str(), log_file_);
    std::fflush(log_file_);
    return;
  }
  if (bar_drawn_) std::fputs("\r\033[K", stdout);
  std::fputs((text + "\n").c_str(), stdout);
  std::fflush(stdout);
  bar_drawn_ = false;
}

void Progress::step(const StepReport& r) {
  if (!enabled_) return;
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  double eta = r.step > 0 ? elapsed / static_cast<double>(r.step) * static_cast<double>(r.total_steps - r.step) : -1;
  std::string eval = r.eval_loss >= 0 ? fmt::format(" eval_loss {:.4f}", r.eval_loss) : "";
  // A step whose micro-batches had no target token has no loss.
  const std::string loss = std::isfinite(r.loss) ? fmt::format("{:.4f}", r.loss) : std::string("- (no target token)");
  if (bar_) {
    const int width = 24;
    int filled = r.total_steps ? static_cast<int>(width * r.step / r.total_steps) : width;
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(width, '.');
    std::fprintf(stdout, "\r\033[K%3d%% [%s] %lld/%lld loss %s lr %.3g %.0f tok/s %s<%s%s",
                 r.total_steps ? static_cast<int>(100 * r.step / r.total_steps) : 100, bar.c_str(),
                 static_cast<long long>(r.step), static_cast<long long>(r.total_steps), loss.c_str(), r.lr,
                 r.tokens_per_second, format_duration(elapsed).c_str(), format_duration(eta).c_str(), eval.c_str());
    std::fflush(stdout);
    bar_drawn_ = true;
    return;
  }
  const std::string norm = r.skipped ? "skipped (fp16 overflow)" : fmt::format("{:.4g}", r.grad_norm);
  emit_line(fmt::format("step {}/{} epoch {} loss {} lr {:.3g} grad_norm {} {:.0f} tok/s elapsed {} eta {}{}",
                        r.step, r.total_steps, r.epoch, loss, r.lr, norm, r.tokens_per_second,
                        format_duration(elapsed), format_duration(eta), eval));
}

void Progress::message(const std::string& text) {
  if (enabled_) emit_line(text);
}

void Progress::finish() {
  if (enabled_ && bar_drawn_) {
    std::fputs("\n", stdout);
    std::fflush(stdout);
    bar_drawn_ = false;
  }
}

}  // namespace fsdpq
