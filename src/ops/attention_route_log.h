// What an attention route that may decline a call (cuDNN's, ops/attention_cudnn.h; fsdpq's Hopper
// kernels, ops/cuda/attention_wgmma.h) did with the calls offered to it since the process started:
// how many it ran and declined per pass (the tests check which kernels ran), and which reasons for
// declining were told already (each is logged once; the route words the line).
#pragma once
#include <cstdint>
#include <mutex>
#include <set>
#include <string>

namespace fsdpq {

struct AttentionRouteCounts {
  int64_t forward_ran = 0, forward_declined = 0;
  int64_t backward_ran = 0, backward_declined = 0;
};

class AttentionRouteLog {
 public:
  void ran(bool backward) {
    const std::lock_guard<std::mutex> lock(mutex_);
    ++(backward ? counts_.backward_ran : counts_.forward_ran);
  }
  // Counts a declined call; true the first time `reason` comes up (the caller logs it then).
  bool declined(bool backward, const std::string& reason) {
    const std::lock_guard<std::mutex> lock(mutex_);
    ++(backward ? counts_.backward_declined : counts_.forward_declined);
    return told_.insert(reason).second;
  }
  AttentionRouteCounts counts() {
    const std::lock_guard<std::mutex> lock(mutex_);
    return counts_;
  }

 private:
  std::mutex mutex_;
  AttentionRouteCounts counts_;
  std::set<std::string> told_;
};

}  // namespace fsdpq
