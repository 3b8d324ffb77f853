// ClientSession::Recover: an engine rides through its daemon's restart (client_session.h;
// docs/DESIGN.md, "Engines ride through a restart").
//
// A restarted daemon takes back every durable request it journaled, each an orphan of the session
// that held it, adoptable by a session of the same uid and engine name (daemon/request_journal.h).
// So riding through is what an engine did by hand after its own death, done by the client: open a
// session with the same options (retrying with backoff while the daemon is coming back), adopt
// the old session's durable requests (the same pages: nothing is prefilled again), resume those
// that were live, and tell the engine which of its requests were kept and which were lost. The
// old session is not changed; the caller swaps the new one in at a step boundary, once the kernels
// it launched on the old arena are done (hs_session_recover does, behind the handle).
//
// Until then the old session refuses the data path and has unpublished every row (WatchStream):
// the state of a row is unknown from the moment the stream ended, so nothing is served from the
// old mappings, even by a captured graph.
#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client_session.h"
#include "hisparse/common/status_macros.h"

namespace hisparse {
namespace {

constexpr absl::Duration kFirstBackoff = absl::Milliseconds(20);
constexpr absl::Duration kMaxBackoff = absl::Seconds(1);
// How long a predecessor on the same daemon process may take to end there (the daemon ends a
// session when it sees its stream go; milliseconds).
constexpr absl::Duration kEndingGrace = absl::Seconds(2);

// Whether an open that failed this way may work later: the daemon not reachable (restarting),
// not answering in time, draining. A TP rank still held by the old session (the same daemon has
// not ended it yet) is ALREADY_EXISTS.
bool Transient(const absl::Status& s, bool in_group) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) || (in_group && absl::IsAlreadyExists(s));
}

// Milliseconds until `deadline`, at most `cap` and at least 1.
uint32_t MillisLeft(absl::Time deadline, uint32_t cap) {
  const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
  return static_cast<uint32_t>(std::clamp<int64_t>(left, 1, cap));
}

void Backoff(absl::Duration* d) {
  absl::SleepFor(*d);
  *d = std::min(*d * 2, kMaxBackoff);
}

}  // namespace

absl::StatusOr<ClientSession::Recovered> ClientSession::Recover(absl::Duration timeout) {
  absl::MutexLock serial(&recover_mu_);
  if (alive_) {
    return absl::FailedPreconditionError(
        "recover: the session is live; recover one the daemon ended (hs_session_get_state says so)");
  }
  const auto t0 = std::chrono::steady_clock::now();
  const absl::Time deadline = absl::Now() + timeout;
  const Held held = HeldRequests();
  std::vector<Predecessor> predecessors{{session_id(), opened_.daemon_instance()}};
  predecessors.insert(predecessors.end(), lost_successors_.begin(), lost_successors_.end());
  Recovered out;
  out.recovery.old_session_id = session_id();
  while (true) {
    HS_ASSIGN_OR_RETURN(out.session, Reopen(deadline, &out.recovery.attempts));
    out.recovery.reopen_seconds = SecondsSince(t0);
    HandSlabsTo(out.session.get());
    const absl::Status adopted = out.session->AdoptPredecessors(predecessors, held, deadline, &out.recovery);
    {
      absl::MutexLock lock(&out.session->reuse_mu_);
      out.session->reusable_.clear();  // what the new daemon did not name: unregistered and unmapped
    }
    if (adopted.ok()) break;
    // What it adopted before failing is its own now: the next session adopts it from there (once
    // this one is gone, an orphan of its id).
    const Predecessor lost{out.session->session_id(), out.session->opened_.daemon_instance()};
    out.session.reset();
    lost_successors_.push_back(lost);
    predecessors.push_back(lost);
    if (!Transient(adopted, false) || absl::Now() >= deadline) {
      return absl::Status(adopted.code(), absl::StrCat("recover: adopting the durable requests of session ",
                                                       session_id(), ": ", adopted.message()));
    }
    out.recovery = Recovery{};
    out.recovery.old_session_id = session_id();
  }
  out.recovery.new_session_id = out.session->session_id();
  out.recovery.arena_moved = out.session->arena_.records != arena_.records;
  HandArenaTo(out.session.get());
  out.recovery.seconds = SecondsSince(t0);
  lost_successors_.clear();
  return out;
}

absl::StatusOr<std::unique_ptr<ClientSession>> ClientSession::Reopen(absl::Time deadline, uint32_t* attempts) {
  hs_session_options o = saved_.options;
  o.daemon_address = saved_.address.c_str();
  o.engine_name = saved_.engine_name.c_str();
  o.group = saved_.group.empty() ? nullptr : saved_.group.c_str();
  o.layer_anchor = saved_.layer_anchor.empty() ? nullptr : saved_.layer_anchor.data();
  absl::Duration backoff = kFirstBackoff;
  while (true) {
    ++*attempts;
    o.timeout_ms = MillisLeft(deadline, timeout_ms_);  // each control call's own deadline, within ours
    absl::StatusOr<std::unique_ptr<ClientSession>> fresh = std::unique_ptr<ClientSession>(new ClientSession());
    if (absl::Status st = (*fresh)->Connect(o, saved_.wrap, this); !st.ok()) fresh = st;
    if (fresh.ok()) {
      // The new session's control calls keep this one's deadline, not what was left of Recover's.
      (*fresh)->timeout_ms_ = timeout_ms_;
      (*fresh)->saved_.options.timeout_ms = saved_.options.timeout_ms;
      return fresh;
    }
    const absl::Status& why = fresh.status();
    if (!Transient(why, !saved_.group.empty())) {
      return absl::Status(why.code(), absl::StrCat("recover: opening a session again: ", why.message()));
    }
    if (absl::Now() + backoff >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("recover: no session opened at ", saved_.address, " in ",
                                                      *attempts,
                                                      " attempts before the deadline; the last said: ", why.message()));
    }
    Backoff(&backoff);
  }
}

void ClientSession::HandSlabsTo(ClientSession* successor) {
  absl::flat_hash_map<uint64_t, Slab> slabs;
  {
    absl::MutexLock lock(&mu_);  // the session ended: nothing publishes a row from them again
    slabs = std::move(slabs_);
    slabs_.clear();
  }
  absl::MutexLock lock(&successor->reuse_mu_);
  for (auto& [id, slab] : slabs) {
    // Only a registration with the backend the successor uses is of use to it.
    if (slab.registered_with == successor->backend_.get()) successor->reusable_.emplace(slab.file, std::move(slab));
  }
}

void ClientSession::HandArenaTo(ClientSession* successor) {
  if (successor->arena_in_place_) {
    successor->arena_map_ = std::move(arena_map_);
    successor->arena_in_place_ = false;
  }
  if (successor->backend_ == backend_) {
    successor->owns_arena_ = owns_arena_;
    owns_arena_ = false;
  }
}

ClientSession::Held ClientSession::HeldRequests() const {
  Held held;
  const auto now = std::chrono::steady_clock::now();
  absl::MutexLock lock(&mu_);
  for (const auto& [id, r] : requests_) held.parked[id] = r.parked;
  for (const auto& [id, pending] : imports_) held.parked.emplace(id, false);  // never durable: lost
  for (const auto& [id, end] : lease_end_) {
    if (!held.parked.contains(id)) continue;
    held.leased.insert(id);
    held.lease_running = held.lease_running || end > now;
  }
  held.evicted = evicted_;
  return held;
}

absl::Status ClientSession::AdoptPredecessors(const std::vector<Predecessor>& predecessors, const Held& held,
                                              absl::Time deadline, Recovery* out) {
  std::vector<uint64_t> adopted;
  for (const Predecessor& p : predecessors) {
    if (held.leased.empty() && p.session_id == predecessors.front().session_id) continue;  // nothing durable
    // A predecessor on this daemon process may still be ending here: its orphans appear then.
    const bool same_daemon = !p.daemon_instance.empty() && p.daemon_instance == opened_.daemon_instance();
    const absl::Time give_up = std::min(deadline, absl::Now() + kEndingGrace);
    absl::Duration backoff = kFirstBackoff;
    while (true) {
      absl::StatusOr<std::vector<uint64_t>> ids = Adopt(p.session_id);
      if (ids.ok()) {
        adopted.insert(adopted.end(), ids->begin(), ids->end());
        break;
      }
      if (!absl::IsNotFound(ids.status())) return ids.status();
      // NotFound: nothing of it was kept (a daemon without a store, leases that ended), or it has
      // not ended yet on this same process.
      if (!same_daemon || !held.lease_running || absl::Now() + backoff >= give_up) break;
      Backoff(&backoff);
    }
  }
  std::vector<uint64_t> foreign;  // adopted, yet not requests the old session knew: not this engine's
  std::vector<uint64_t> live;     // to resume
  absl::flat_hash_map<uint64_t, int32_t> rows;
  for (uint64_t id : adopted) {
    auto it = held.parked.find(id);
    if (it == held.parked.end()) {
      foreign.push_back(id);
    } else {
      rows[id] = -1;
      if (!it->second) live.push_back(id);
    }
  }
  for (size_t i = 0; i < foreign.size(); i += HS_BATCH_MAX_ITEMS) {
    const std::vector<uint64_t> chunk(foreign.begin() + i,
                                      foreign.begin() + std::min<size_t>(foreign.size(), i + HS_BATCH_MAX_ITEMS));
    HS_RETURN_IF_ERROR(ReleaseBatch(chunk).status());
  }
  for (size_t i = 0; i < live.size(); i += HS_BATCH_MAX_ITEMS) {
    const std::vector<uint64_t> chunk(live.begin() + i,
                                      live.begin() + std::min<size_t>(live.size(), i + HS_BATCH_MAX_ITEMS));
    // Per item: one that finds no row (or that this process cannot install) stays parked and kept.
    HS_ASSIGN_OR_RETURN(BatchResumed resumed, ResumeBatch(chunk, /*all_or_nothing=*/false));
    for (size_t j = 0; j < chunk.size(); ++j) {
      if (resumed.items[j].ok()) rows[chunk[j]] = static_cast<int32_t>(resumed.items[j]->row);
    }
  }
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, row] : rows) {
      const Request& r = requests_.at(id);
      out->kept.push_back(Recovery::Kept{id, row, r.capacity});
    }
  }
  for (const auto& [id, parked] : held.parked) {
    if (!rows.contains(id)) out->lost.push_back(id);
  }
  out->lost.insert(out->lost.end(), held.evicted.begin(), held.evicted.end());
  std::sort(out->kept.begin(), out->kept.end(),
            [](const Recovery::Kept& a, const Recovery::Kept& b) { return a.request_id < b.request_id; });
  std::sort(out->lost.begin(), out->lost.end());
  out->lost.erase(std::unique(out->lost.begin(), out->lost.end()), out->lost.end());
  return absl::OkStatus();
}

}  // namespace hisparse
