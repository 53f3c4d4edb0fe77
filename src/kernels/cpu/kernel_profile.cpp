#include "kernels/cpu/kernel_profile.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

namespace transmuter::kernels {

namespace {

struct Totals {
  int64_t calls = 0;
  double seconds = 0;
};

// The process-wide table, printed by its destructor at exit.
class Profile {
 public:
  void add(const std::string& key, double seconds) {
    std::lock_guard<std::mutex> lock(mutex_);
    Totals& t = totals_[key];
    ++t.calls;
    t.seconds += seconds;
  }
  ~Profile() { print(); }

 private:
  void print() const {
    std::vector<std::pair<std::string, Totals>> rows(totals_.begin(), totals_.end());
    std::sort(rows.begin(), rows.end(),
              [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
    double all = 0;
    for (const auto& row : rows) all += row.second.seconds;
    std::fprintf(stderr, "kernel profile (TRANSMUTER_KERNEL_PROFILE): %.3f ms in %zu kernel/shape rows\n",
                 all * 1e3, rows.size());
    std::fprintf(stderr, "%10s %6s %8s %10s  %s\n", "total_ms", "share", "calls", "mean_us", "kernel");
    for (const auto& [key, t] : rows)
      std::fprintf(stderr, "%10.3f %5.1f%% %8lld %10.1f  %s\n", t.seconds * 1e3, 100 * t.seconds / all,
                   static_cast<long long>(t.calls), t.seconds * 1e6 / static_cast<double>(t.calls),
                   key.c_str());
  }

  std::mutex mutex_;
  std::map<std::string, Totals> totals_;
};

Profile& profile() {
  static Profile table;
  return table;
}

std::string shape_text(const mx::array& a) {
  std::string text;
  for (size_t i = 0; i < a.shape().size(); ++i) text += (i ? "x" : "") + std::to_string(a.shape()[i]);
  return text.empty() ? "scalar" : text;
}

}  // namespace

bool kernel_profile_enabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("TRANSMUTER_KERNEL_PROFILE");
    return value != nullptr && *value != '\0' && std::strcmp(value, "0") != 0;
  }();
  return enabled;
}

std::string kernel_profile_key(const char* name, const std::vector<mx::array>& inputs,
                               const std::vector<mx::array>& outputs) {
  std::string key = name;
  if (!inputs.empty()) key += " " + shape_text(inputs[0]);
  if (!outputs.empty()) key += " -> " + shape_text(outputs[0]);
  return key;
}

KernelTask profiled_task(std::string key, KernelTask task) {
  Profile& table = profile();  // constructed before the first task runs, so destroyed after it
  return [&table, key = std::move(key), task = std::move(task)]() {
    const auto start = std::chrono::steady_clock::now();
    task();
    table.add(key, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  };
}

}  // namespace transmuter::kernels
