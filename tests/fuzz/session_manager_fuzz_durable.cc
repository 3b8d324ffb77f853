// The session-manager fuzzer's durable-request ops (session_manager_fuzz_model.h): SetLease, Admit
// with a lease, ListAdoptable, Adopt, the live lease bound (SetMaxLeaseSeconds), the clock and the
// lease sweep, and a session's end, each checked against the model: a lease above the bound is
// refused and one granted keeps its deadline, an ended session leaves exactly its durable
// requests as an orphan, adoption moves all of them (or nothing, with the documented code), and
// the sweep releases exactly the expired ones.
#include <unistd.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "fuzz_check.h"
#include "session_manager_fuzz_model.h"

namespace hisparse::fuzz {
namespace {

// Mostly within a few seconds of the bound, sometimes any 32-bit value.
uint32_t PickLease(FuzzInput& in) { return in.Read<uint8_t>() < 8 ? in.Read<uint32_t>() : in.Small(0, 130); }

// The lease's end on the model's clock, or none (0 clears it).
void SetModelLease(LiveSession& s, uint64_t id, uint32_t lease) {
  if (lease == 0) {
    s.lease_end.erase(id);
  } else {
    s.lease_end[id] = FakeNow() + lease;
  }
}

// Drops the orphan's requests whose lease has ended by now; returns how many. The orphan goes
// once empty.
size_t ExpireInModel(Model& m, uint64_t orphan_id) {
  auto it = m.orphans.find(orphan_id);
  if (it == m.orphans.end()) return 0;
  size_t n = 0;
  for (auto r = it->second.lease_end.begin(); r != it->second.lease_end.end();) {
    if (r->second > FakeNow()) {
      ++r;
    } else {
      r = it->second.lease_end.erase(r);
      ++n;
    }
  }
  if (it->second.lease_end.empty()) m.orphans.erase(it);
  m.expired += n;
  return n;
}

void SetLeaseOne(FuzzInput& in, Model& m) {
  LiveSession* owner = nullptr;
  v1::SetLeaseRequest req;
  *req.mutable_session() = PickRef(in, m.live, &owner);
  req.set_request_id(PickRequestId(in));
  req.set_lease_seconds(PickLease(in));
  auto r = Manager().SetLease(req);
  const uint32_t lease = req.lease_seconds();
  if (owner == nullptr) {
    Expect(absl::IsPermissionDenied(r.status()), "SetLease with a foreign or wrong ref: " + r.status().ToString());
  } else if (owner->requests.count(req.request_id()) == 0) {
    Expect(absl::IsNotFound(r.status()), "SetLease of an id not held: " + r.status().ToString());
  } else if (lease != 0 && (owner->shares.count(req.request_id()) != 0 || m.max_lease == 0)) {
    Expect(absl::IsFailedPrecondition(r.status()),
           "SetLease on a group share or with durability off: " + r.status().ToString());
  } else if (lease > m.max_lease) {
    Expect(absl::IsInvalidArgument(r.status()), "SetLease above the bound: " + r.status().ToString());
  } else {
    Expect(r.ok(), "SetLease within the bound failed: " + r.status().ToString());
    if (!r.ok()) return;
    Expect(r->lease_seconds_left() == static_cast<double>(lease), "SetLease answered another lease");
    SetModelLease(*owner, req.request_id(), lease);
  }
}

void AdmitDurableOne(FuzzInput& in, Model& m) {
  LiveSession* owner = nullptr;
  v1::AdmitRequest req;
  *req.mutable_session() = PickRef(in, m.live, &owner);
  req.set_request_id(PickRequestId(in));
  req.set_token_budget(in.Small(0, 64) * 64);
  req.set_context_tokens(req.token_budget() / 2);
  req.set_lease_seconds(PickLease(in));
  auto r = Manager().Admit(req);
  const uint32_t lease = req.lease_seconds();
  if (owner == nullptr) {
    Expect(absl::IsPermissionDenied(r.status()), "Admit with a foreign or wrong ref: " + r.status().ToString());
  } else if (r.ok()) {
    Expect(lease == 0 || lease <= m.max_lease, "Admit granted a lease above the bound");
    Expect(!m.draining, "Admit succeeded while draining");
    Expect(owner->requests.insert(req.request_id()).second, "Admit succeeded for an id already held");
    SetModelLease(*owner, req.request_id(), lease);
  } else {
    Expect(absl::IsInvalidArgument(r.status()) || absl::IsFailedPrecondition(r.status()) ||
               absl::IsResourceExhausted(r.status()) || absl::IsAlreadyExists(r.status()),
           "a durable Admit failed with an undocumented code: " + r.status().ToString());
  }
}

void ListAdoptableOne(FuzzInput& in, Model& m) {
  LiveSession* owner = nullptr;
  v1::ListAdoptableRequest req;
  *req.mutable_session() = PickRef(in, m.live, &owner);
  auto r = Manager().ListAdoptable(req);
  if (owner == nullptr) {
    Expect(absl::IsPermissionDenied(r.status()), "ListAdoptable with a wrong ref: " + r.status().ToString());
    return;
  }
  Expect(r.ok(), "ListAdoptable of a live session: " + r.status().ToString());
  if (!r.ok()) return;
  int i = 0;
  for (const auto& [dead, o] : m.orphans) {
    if (o.uid != owner->uid || o.engine != owner->engine) continue;
    for (const auto& [rid, end] : o.lease_end) {
      if (end <= FakeNow()) continue;  // ended; the sweep has not run yet
      Expect(i < r->requests_size(), "ListAdoptable lacks an orphaned request");
      const v1::AdoptableRequest& a = r->requests(i++);
      Expect(a.dead_session_id() == dead && a.request_id() == rid, "ListAdoptable lists another request");
      Expect(a.lease_seconds_left() == static_cast<double>(end - FakeNow()), "an orphan's lease moved");
    }
  }
  Expect(i == r->requests_size(), "ListAdoptable lists a request no orphan holds");
}

void AdoptOne(FuzzInput& in, Model& m) {
  LiveSession* owner = nullptr;
  v1::AdoptRequest req;
  *req.mutable_session() = PickRef(in, m.live, &owner);
  const uint8_t how = in.Read<uint8_t>();
  if (!m.orphans.empty() && how % 4 != 3) {
    auto it = m.orphans.begin();
    std::advance(it, in.Read<uint8_t>() % m.orphans.size());
    req.set_dead_session_id(it->first);
  } else {
    req.set_dead_session_id(in.Read<uint8_t>());
  }
  auto r = Manager().Adopt(req);
  auto oit = m.orphans.find(req.dead_session_id());
  if (owner == nullptr) {
    Expect(absl::IsPermissionDenied(r.status()), "Adopt with a wrong ref: " + r.status().ToString());
    return;
  }
  if (oit == m.orphans.end()) {
    Expect(absl::IsNotFound(r.status()), "Adopt of no orphan: " + r.status().ToString());
    return;
  }
  if (oit->second.uid != owner->uid || oit->second.engine != owner->engine) {
    Expect(absl::IsPermissionDenied(r.status()), "Adopt of another tenant's or engine's: " + r.status().ToString());
    return;
  }
  ExpireInModel(m, req.dead_session_id());  // Adopt releases what has ended first, whatever follows
  oit = m.orphans.find(req.dead_session_id());
  if (oit == m.orphans.end()) {
    Expect(absl::IsNotFound(r.status()), "Adopt of an orphan whose leases all ended: " + r.status().ToString());
    return;
  }
  bool collides = false;
  for (const auto& [rid, end] : oit->second.lease_end) collides |= owner->requests.count(rid) != 0;
  if (!r.ok()) {
    Expect(absl::IsFailedPrecondition(r.status()) || (collides && absl::IsAlreadyExists(r.status())),
           "Adopt failed with an undocumented code: " + r.status().ToString());
    return;
  }
  Expect(!collides && !m.draining, "Adopt took an id the adopter holds, or adopted while draining");
  Expect(r->requests_size() == static_cast<int>(oit->second.lease_end.size()), "Adopt moved another count");
  int i = 0;
  for (const auto& [rid, end] : oit->second.lease_end) {
    Expect(r->requests(i++).request_id() == rid, "Adopt moved another request");
    owner->requests.insert(rid);
    owner->parked.insert(rid);
    owner->lease_end[rid] = end;
  }
  m.orphans.erase(oit);
}

}  // namespace

LiveSession* Model::Find(uint64_t session_id) {
  for (LiveSession& s : live) {
    if (s.id == session_id) return &s;
  }
  return nullptr;
}

size_t Model::OrphanedRequests() const {
  size_t n = 0;
  for (const auto& [id, o] : orphans) n += o.lease_end.size();
  return n;
}

void CloseInModel(Model& m, size_t i) {
  LiveSession s = std::move(m.live[i]);
  m.live.erase(m.live.begin() + static_cast<std::ptrdiff_t>(i));
  Manager().CloseSession(s.id);
  Orphan o;
  o.engine = s.engine;
  o.uid = s.uid;
  for (const auto& [rid, end] : s.lease_end) {
    Expect(s.shares.count(rid) == 0, "a TP-group share became durable");
    if (end > FakeNow()) o.lease_end.emplace(rid, end);
  }
  if (!o.lease_end.empty()) m.orphans.emplace(s.id, std::move(o));
  if (s.group.empty()) return;
  auto git = m.groups.find({s.uid, s.group});
  Expect(git != m.groups.end(), "a member of a group the model lacks");
  std::vector<uint64_t>& ranks = git->second.ranks;
  std::replace(ranks.begin(), ranks.end(), s.id, uint64_t{0});
  if (std::all_of(ranks.begin(), ranks.end(), [](uint64_t id) { return id == 0; })) m.groups.erase(git);
}

void DurableOne(FuzzInput& in, Model& m) {
  switch (in.Read<uint8_t>() % 5) {
    case 0:
      SetLeaseOne(in, m);
      break;
    case 1:
      AdmitDurableOne(in, m);
      break;
    case 2:
      ListAdoptableOne(in, m);
      break;
    case 3:
      AdoptOne(in, m);
      break;
    default:  // a reload of durability.max_lease_seconds
      m.max_lease = in.Small(0, kMaxLeaseBound);
      Manager().SetMaxLeaseSeconds(m.max_lease);
      break;
  }
}

void ClockOne(FuzzInput& in, Model& m) {
  FakeNow() += in.Small(0, 255);
  if (in.Read<uint8_t>() % 2 == 0) return;
  size_t want = 0;
  std::vector<uint64_t> ids;
  for (const auto& [id, o] : m.orphans) ids.push_back(id);
  for (uint64_t id : ids) want += ExpireInModel(m, id);
  const size_t got = Manager().ExpireLeases();
  Expect(got == want, "ExpireLeases released " + std::to_string(got) + " requests, the model " + std::to_string(want));
}

void CheckDurableStats(const Model& m) {
  const v1::StatsResponse st = Manager().Stats();
  uint32_t durable = 0;
  for (const LiveSession& s : m.live) {
    for (const auto& [rid, end] : s.lease_end) durable += end > FakeNow() ? 1 : 0;
  }
  Expect(st.durable_requests() == durable, "Stats.durable_requests disagrees with the model");
  Expect(st.orphaned_requests() == m.OrphanedRequests(), "Stats.orphaned_requests disagrees with the model");
  Expect(st.lease_expiries() == m.expiries_before + m.expired, "Stats.lease_expiries disagrees with the model");
  // Every orphaned request holds a page at least; none left holds none.
  Expect((st.orphaned_bytes() == 0) == (m.orphans.empty()), "Stats.orphaned_bytes disagrees with the model");
  size_t held = m.OrphanedRequests();
  for (const LiveSession& s : m.live) held += s.requests.size();
  Expect(held != 0 || st.host_pool().pages_used() == 0,
         "pool pages used while no request is held: " + std::to_string(st.host_pool().pages_used()));
  Expect(st.groups_size() == static_cast<int>(m.groups.size()), "Stats.groups disagrees with the model");
  int g = 0;
  for (const auto& [key, group] : m.groups) {
    const std::string& name = key.second;
    if (g >= st.groups_size()) break;
    const v1::GroupStats& gs = st.groups(g++);
    Expect(gs.name() == name && gs.rank_sessions_size() == static_cast<int>(group.ranks.size()),
           "Stats lists another group");
    for (size_t r = 0; r < group.ranks.size(); ++r) {
      Expect(gs.rank_sessions(static_cast<int>(r)) == group.ranks[r], "a group's rank is another session");
    }
  }
}

}  // namespace hisparse::fuzz
