#include "runtime/host_reads.h"

namespace transmuter {

std::shared_ptr<const SignatureMemo> SignatureMemoCache::find(const std::string& signature) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->first != signature) continue;
    entries_.splice(entries_.begin(), entries_, it);
    return entries_.front().second;
  }
  return nullptr;
}

void SignatureMemoCache::insert(const std::string& signature, std::shared_ptr<const SignatureMemo> memo) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& entry : entries_) {
    if (entry.first == signature) return;  // another thread published it first
  }
  entries_.emplace_front(signature, std::move(memo));
  if (entries_.size() > kCapacity) entries_.pop_back();
}

size_t SignatureMemoCache::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

}  // namespace transmuter
