// PageSharers: one session's pages held by more than one of its requests (shared prefixes;
// docs/DESIGN.md, "Shared prefixes"; shared_prefixes.cc admits them). Each shared page has its
// holders in the order they took it; the first pays for it (RequestEntry::charged_pages, the
// ledger's count), and when it lets go the next one pays. A page held by one request is not here.
//
// Not thread-safe: SessionManager calls it under its mutex.
#ifndef HISPARSE_DAEMON_PAGE_SHARERS_H_
#define HISPARSE_DAEMON_PAGE_SHARERS_H_

#include <cstdint>
#include <map>
#include <vector>

#include "hisparse/daemon/page_pool.h"

namespace hisparse {

class PageSharers {
 public:
  using Map = std::map<PagePool::Page, std::vector<uint64_t>>;

  // Request `child` takes page `p`, which `parent` holds (and pays for, if nobody shared it yet).
  void Share(const PagePool::Page& p, uint64_t parent, uint64_t child);
  // Takes request `id`, which holds `pages`, out of every page it shares. Returns, once per page
  // it paid for that another request still holds, that request's id: the new payer of the page.
  std::vector<uint64_t> Unshare(uint64_t id, const std::vector<std::vector<PagePool::Page>>& pages);
  bool IsShared(const PagePool::Page& p) const { return sharers_.count(p) != 0; }
  // How many of `pages` are shared.
  uint64_t SharedOf(const std::vector<std::vector<PagePool::Page>>& pages) const;
  // Moves `other`'s pages in (adoption; pages of other slabs, so none collide) and empties it.
  void Merge(PageSharers& other);
  const Map& all() const { return sharers_; }
  bool empty() const { return sharers_.empty(); }

 private:
  Map sharers_;
};

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_PAGE_SHARERS_H_
