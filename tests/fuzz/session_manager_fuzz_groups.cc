// The session-manager fuzzer's TP-group ops (session_manager_fuzz_model.h): OpenSession with a
// group (a few names, sizes and ranks, sometimes another tenant, geometry or a malformed group),
// and group admission (reserve for every rank, or attach this rank's share), checked against the
// model: a rank is held by one live session, a group belongs to one tenant, a reservation gives
// every member a share of an id none of them held, an attach needs a reserved share. The existing
// ops (Extend, Release, Park, Close...) act on shares as on any request the model holds.
#include <unistd.h>

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "fuzz_check.h"
#include "session_manager_fuzz_model.h"

namespace hisparse::fuzz {

void GroupOpenOne(FuzzInput& in, Model& m) {
  v1::OpenSession open;
  v1::Geometry* g = open.mutable_geometry();
  g->set_gpu(-1);
  g->set_num_layers(in.Small(1, 2));
  g->set_record_bytes(in.Read<uint8_t>() % 8 == 0 ? 128 : 64);
  g->set_k(4);
  g->set_slots(8);
  g->set_max_requests(in.Small(1, 4));
  open.set_engine_name(in.Read<uint8_t>() % 4 == 0 ? "other" : "tp");
  const uint32_t uid = ::getuid() + (in.Read<uint8_t>() % 8 == 7 ? 1 : 0);
  v1::TpGroup* group = open.mutable_group();
  const uint8_t name = in.Read<uint8_t>();
  group->set_name(name < 8 ? in.String(140) : "g" + std::to_string(name % 3));
  group->set_size(in.Small(0, 4));
  group->set_rank(in.Small(0, 4));
  auto opened = Manager().OpenSession(open, PeerCredentials{::getpid(), uid, ::getgid()});
  auto git = m.groups.find({uid, group->name()});
  if (!opened.ok()) {
    const absl::Status& st = opened.status();
    Expect(absl::IsInvalidArgument(st) || absl::IsResourceExhausted(st) || absl::IsFailedPrecondition(st) ||
               absl::IsPermissionDenied(st) || absl::IsAlreadyExists(st),
           "OpenSession with a group failed with an undocumented code: " + st.ToString());
    if (absl::IsAlreadyExists(st)) {
      Expect(git != m.groups.end() && group->rank() < git->second.ranks.size() && git->second.ranks[group->rank()] != 0,
             "OpenSession refused a free rank as taken");
    }
    if (absl::IsPermissionDenied(st)) {
      Expect(git != m.groups.end() && git->second.uid != uid, "OpenSession refused a group of its own tenant");
    }
    return;
  }
  Expect(group->size() >= 1 && group->rank() < group->size(), "OpenSession took a malformed group");
  Expect(!m.draining, "OpenSession succeeded while draining");
  if (git == m.groups.end()) {
    git = m.groups.emplace(std::make_pair(uid, group->name()), ModelGroup{uid, std::vector<uint64_t>(group->size(), 0)})
              .first;
  }
  ModelGroup& mg = git->second;
  Expect(mg.uid == uid, "a group took a member of another tenant");
  Expect(mg.ranks.size() == group->size(), "a group took a member of another size");
  Expect(mg.ranks[group->rank()] == 0, "a group's rank was given to two live sessions");
  mg.ranks[group->rank()] = opened->session_id();
  LiveSession s;
  s.id = opened->session_id();
  s.token = opened->token();
  s.engine = open.engine_name();
  s.uid = uid;
  s.group = group->name();
  m.live.push_back(std::move(s));
}

void GroupAdmitOne(FuzzInput& in, Model& m) {
  LiveSession* owner = nullptr;
  v1::AdmitRequest req;
  *req.mutable_session() = PickRef(in, m.live, &owner);
  req.set_request_id(PickRequestId(in));
  req.set_token_budget(in.Small(0, 15) * 256);  // few values: an attach must repeat the reservation's
  req.set_group(true);
  const uint8_t extra = in.Read<uint8_t>();
  if (extra % 16 == 1) req.set_lease_seconds(10);           // never durable: INVALID_ARGUMENT
  if (extra % 16 == 2) req.set_parent_request_id(1);        // no prefix sharing: INVALID_ARGUMENT
  if (extra % 16 == 3) req.set_context_tokens(UINT32_MAX);  // above the budget: INVALID_ARGUMENT
  auto r = Manager().Admit(req);
  const uint64_t id = req.request_id();
  if (owner == nullptr) {
    Expect(absl::IsPermissionDenied(r.status()), "a group Admit with a wrong ref: " + r.status().ToString());
    return;
  }
  if (!r.ok()) {
    const absl::Status& st = r.status();
    Expect(absl::IsInvalidArgument(st) || absl::IsFailedPrecondition(st) || absl::IsResourceExhausted(st) ||
               absl::IsAlreadyExists(st),
           "a group Admit failed with an undocumented code: " + st.ToString());
    return;
  }
  Expect(!owner->group.empty() && !m.draining && (extra % 16 == 0 || extra % 16 > 3),
         "a group Admit succeeded outside a group, while draining or with bad input");
  if (owner->shares.count(id) != 0) {  // this rank's share, reserved by another rank: attached now
    Expect(owner->attached.insert(id).second, "a group Admit attached a share twice");
    return;
  }
  Expect(owner->requests.count(id) == 0, "a group Admit succeeded for an id this session holds");
  const ModelGroup& mg = m.groups.at({owner->uid, owner->group});
  for (uint64_t member : mg.ranks) {
    LiveSession* s = m.Find(member);
    Expect(s != nullptr, "a group reserved a request while it lacked a rank");
    if (s == nullptr) continue;
    Expect(s->requests.count(id) == 0, "a group reserved request " + std::to_string(id) + " that rank session " +
                                           std::to_string(member) + " already holds");
    s->requests.insert(id);
    s->shares.insert(id);
  }
  owner->attached.insert(id);
}

}  // namespace hisparse::fuzz
