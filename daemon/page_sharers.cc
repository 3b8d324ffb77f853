// Shared pages and who pays for them: see page_sharers.h.
#include "hisparse/daemon/page_sharers.h"

#include <algorithm>

namespace hisparse {

void PageSharers::Share(const PagePool::Page& p, uint64_t parent, uint64_t child) {
  std::vector<uint64_t>& holders = sharers_[p];
  if (holders.empty()) holders.push_back(parent);
  holders.push_back(child);
}

std::vector<uint64_t> PageSharers::Unshare(uint64_t id, const std::vector<std::vector<PagePool::Page>>& pages) {
  std::vector<uint64_t> new_payers;
  if (sharers_.empty()) return new_payers;
  for (const std::vector<PagePool::Page>& layer : pages) {
    for (const PagePool::Page& p : layer) {
      auto it = sharers_.find(p);
      if (it == sharers_.end()) continue;
      std::vector<uint64_t>& holders = it->second;
      const bool was_payer = !holders.empty() && holders.front() == id;
      holders.erase(std::remove(holders.begin(), holders.end(), id), holders.end());
      if (was_payer && !holders.empty()) new_payers.push_back(holders.front());
      if (holders.size() < 2) sharers_.erase(it);
    }
  }
  return new_payers;
}

uint64_t PageSharers::SharedOf(const std::vector<std::vector<PagePool::Page>>& pages) const {
  uint64_t n = 0;
  if (sharers_.empty()) return 0;
  for (const auto& layer : pages) {
    for (const PagePool::Page& p : layer) n += IsShared(p) ? 1 : 0;
  }
  return n;
}

void PageSharers::Merge(PageSharers& other) {
  sharers_.insert(other.sharers_.begin(), other.sharers_.end());
  other.sharers_.clear();
}

}  // namespace hisparse
