// ClientSession's host-pool slabs (client_session.h): mapped and registered outside the lock,
// published under it.
//
// A request's pages lie in slabs of the daemon's pool; this process maps each slab once (the fd
// channel hands its memfd over), registers the mapping with the device (cudaHostRegister on CUDA:
// ~0.04-0.11 s/GiB) and counts the pages of its requests in it. A slab left without a page stays
// mapped while the daemon keeps it for this session (its next request's pages are most likely
// there again), until the daemon's SlabRetired says it left. Fetching, mapping and registering
// are slow and may block, so none of them runs under mu_, which the data path (hs_resolve) takes
// for every step:
//   1. under mu_: which slabs the answer names that slabs_ lacks (MissingSlabsLocked);
//   2. outside it: fetch, mmap and register each of those (MapSlabs);
//   3. under mu_ again: publish them into slabs_ (PublishSlabsLocked) and run the caller's step,
//      which counts its pages and publishes its rows.
// Races: a slab another thread published between 1 and 3 wins, and this thread's mapping of it
// is released after the lock; a slab another thread dropped between 1 and 3 (its last page
// released) is missing again at 3, and 2 runs again for it. Every Slab owns its mapping and its
// registration, so whatever path a mapping takes (published, lost a race, left without a page,
// the session closing) it is released exactly once; and releasing happens after the lock too.
// After a daemon's restart (Recover) the new session takes over the old one's mapping of every
// slab the new daemon names by the same memory (the memfd's inode: the fd store kept the file),
// so recovering a large pool maps and registers nothing again.
#include <sys/stat.h>

#include <chrono>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client_session.h"

namespace hisparse {
namespace {

// Rounds of step 2 before a slab that keeps being dropped meanwhile is an error for the step.
constexpr int kMaxMapRounds = 4;

}  // namespace

ClientSession::SlabIds ClientSession::SlabsOf(const google::protobuf::RepeatedPtrField<v1::LayerPages>& layers) {
  SlabIds ids;
  for (const v1::LayerPages& layer : layers) {
    for (const v1::PageRef& p : layer.pages()) ids.insert(p.slab());
  }
  return ids;
}

void ClientSession::WithSlabsLocked(const SlabIds& needed, absl::FunctionRef<void(const SlabErrors&)> step) {
  // Declared before any lock, so destroyed after it: a mapping that lost a race, and a slab the
  // step left without a page, are unregistered and unmapped outside mu_.
  SlabWork work;
  std::vector<Slab> retired;
  for (int round = 0;; ++round) {
    std::vector<uint64_t> missing;
    {
      absl::MutexLock lock(&mu_);
      missing = MissingSlabsLocked(needed, work);
      if (missing.empty() || round == kMaxMapRounds) {
        for (uint64_t id : missing) {
          work.failed.emplace(id, absl::AbortedError(absl::StrCat("slab ", id,
                                                                  " was dropped by other calls each time it was "
                                                                  "mapped; retry")));
        }
        const std::vector<uint64_t> published = PublishSlabsLocked(&work);
        step(work.failed);
        for (uint64_t id : published) {
          auto it = slabs_.find(id);
          if (it != slabs_.end() && it->second.live_pages == 0 && !KeepIdleLocked(it->second)) {
            retired.push_back(std::move(it->second));
            slabs_.erase(it);
          }
        }
        return;
      }
    }
    MapSlabs(missing, &work);
  }
}

std::vector<uint64_t> ClientSession::MissingSlabsLocked(const SlabIds& needed, const SlabWork& work) const {
  std::vector<uint64_t> missing;
  for (uint64_t id : needed) {
    if (slabs_.contains(id) || work.failed.contains(id)) continue;
    bool mapped = false;
    for (const auto& [fresh_id, slab] : work.fresh) mapped = mapped || fresh_id == id;
    if (!mapped) missing.push_back(id);
  }
  return missing;
}

void ClientSession::MapSlabs(const std::vector<uint64_t>& ids, SlabWork* work) {
  for (uint64_t id : ids) {
    uint64_t bytes = 0;
    auto t = std::chrono::steady_clock::now();
    absl::StatusOr<UniqueFd> fd = FetchFd(FdSlab{id}, &bytes);
    work->phases.fetch_s += SecondsSince(t);
    if (!fd.ok()) {
      work->failed.emplace(id, fd.status());
      continue;
    }
    struct stat st {};
    std::pair<uint64_t, uint64_t> file{0, 0};
    if (::fstat(fd->get(), &st) == 0) file = {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
    if (std::optional<Slab> kept = TakeReusable(file, bytes)) {
      // The same memory a predecessor mapped and registered (Recover): no mmap, no registration.
      work->fresh.emplace_back(id, *std::move(kept));
      continue;
    }
    t = std::chrono::steady_clock::now();
    absl::StatusOr<MappedRegion> map = MappedRegion::MapShared(fd->get(), bytes);
    work->phases.mmap_s += SecondsSince(t);
    if (!map.ok()) {
      work->failed.emplace(id, map.status());
      continue;
    }
    t = std::chrono::steady_clock::now();
    absl::StatusOr<uint8_t*> addr = backend_->RegisterHostSegment(map->data(), bytes);
    work->phases.register_s += SecondsSince(t);
    if (!addr.ok()) {
      work->failed.emplace(id, addr.status());
      continue;  // `map` unmaps here: nothing was registered
    }
    work->fresh.emplace_back(id, Slab(*std::move(map), *addr, backend_.get()));
    work->fresh.back().second.file = file;
  }
}

std::optional<ClientSession::Slab> ClientSession::TakeReusable(std::pair<uint64_t, uint64_t> file, uint64_t bytes) {
  absl::MutexLock lock(&reuse_mu_);
  auto it = reusable_.find(file);
  if (file.second == 0 || it == reusable_.end() || it->second.map.size() != bytes) return std::nullopt;
  Slab slab = std::move(it->second);
  reusable_.erase(it);
  slab.live_pages = 0;
  slab.left = false;
  return slab;
}

std::vector<uint64_t> ClientSession::PublishSlabsLocked(SlabWork* work) {
  host_map_phases_.fetch_s += work->phases.fetch_s;
  host_map_phases_.mmap_s += work->phases.mmap_s;
  host_map_phases_.register_s += work->phases.register_s;
  work->phases = HostMapPhases{};
  std::vector<uint64_t> published;
  for (auto& [id, slab] : work->fresh) {
    if (slab.registered_with == nullptr || slabs_.contains(id)) continue;  // published before, or lost a race
    ++host_map_phases_.slabs;
    host_map_phases_.bytes += slab.map.size();
    slabs_.emplace(id, std::move(slab));
    published.push_back(id);
  }
  return published;
}

absl::Status ClientSession::AcquireSlabs(const Request& r, const SlabErrors& errors) {
  const uint64_t page_bytes = opened_.page_bytes();
  std::vector<Slab*> counted;  // one entry per page counted, to undo on failure
  absl::Status status;
  for (const auto& layer : r.layers) {
    for (const v1::PageRef& p : layer) {
      auto it = slabs_.find(p.slab());
      if (it == slabs_.end()) {
        auto why = errors.find(p.slab());
        status = why != errors.end()
                     ? why->second
                     : absl::InternalError(absl::StrCat("slab ", p.slab(), " of the daemon's answer is not mapped"));
      } else if (p.offset() % page_bytes != 0 || p.offset() + page_bytes > it->second.map.size()) {
        status = absl::InternalError(absl::StrCat("the daemon named a page at offset ", p.offset(), " of slab ",
                                                  p.slab(), ", which does not hold it"));
      }
      if (!status.ok()) break;
      ++it->second.live_pages;
      counted.push_back(&it->second);
    }
    if (!status.ok()) break;
  }
  // Undone, a slab that had pages before keeps them; one published for this request has none and
  // is retired by WithSlabsLocked after the step.
  if (!status.ok()) {
    for (Slab* slab : counted) --slab->live_pages;
  }
  return status;
}

void ClientSession::DropSlabs(const Request& r, std::vector<Slab>* retired) {
  for (const auto& layer : r.layers) {
    for (const v1::PageRef& p : layer) {
      auto it = slabs_.find(p.slab());
      if (it == slabs_.end()) continue;
      if (--it->second.live_pages == 0 && !KeepIdleLocked(it->second)) {
        retired->push_back(std::move(it->second));
        slabs_.erase(it);
      }
    }
  }
}

bool ClientSession::KeepIdleLocked(const Slab& slab) const { return opened_.slab_retired_notices() && !slab.left; }

void ClientSession::OnSlabsRetiredLocked(const v1::SlabRetired& event, std::vector<Slab>* retired) {
  for (uint64_t id : event.slabs()) {
    auto it = slabs_.find(id);
    if (it == slabs_.end()) continue;  // never mapped here, or dropped already
    it->second.left = true;
    if (it->second.live_pages != 0) continue;  // a release this thread has not seen answered yet
    retired->push_back(std::move(it->second));
    slabs_.erase(it);
  }
}

}  // namespace hisparse
