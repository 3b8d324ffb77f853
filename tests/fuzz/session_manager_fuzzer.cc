// Fuzz target: the daemon's request handlers. The input is a program of operations (open a
// session with fuzzed geometry, admit / extend / release / park / resume with fuzzed ids, budgets
// and tokens, admit on a parent's prefix, batched admit / release (op bytes 248..255) and park /
// resume (244..247), close, fd lookups with fuzzed object names, stats, drain; durable requests:
// SetLease, Admit with a lease, ListAdoptable, Adopt and the live lease bound (240), the clock and
// the lease sweep (241); TP groups: OpenSession with a group (242) and group admission (243)) run
// against one in-process SessionManager over a small PagePool. After every operation the
// accounting invariants must hold and the outcome must agree with a shadow model of who holds
// what (session_manager_fuzz_model.h); after the program every session is closed, the clock runs
// past every lease, and the pool must be exactly empty. Anything else aborts (a finding).
//
// The manager and its pool live for the whole process (building a pool per input would spend the
// fuzzer's time pre-touching memory); each input leaves them empty, which is what it checks.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "fuzz_check.h"
#include "fuzz_input.h"
#include "fuzz_reach.h"
#include "hisparse/common/log.h"
#include "hisparse/daemon/page_pool.h"
#include "hisparse/daemon/session_manager.h"
#include "session_manager_fuzz_model.h"

namespace hisparse::fuzz {

constexpr int kMaxOps = 256;
constexpr int64_t kEpoch = 1000000000;  // the clock at each input's start, in seconds

int64_t& FakeNow() {
  static int64_t now = kEpoch;
  return now;
}

SessionManager& Manager() {
  // Leaked on purpose: no destructor ordering against libFuzzer's exit paths.
  static SessionManager* const manager = [] {
    SetLogThreshold(LogSeverity::kError);  // one line per open/close would drown the fuzzer
    PagePool::Options pool;
    pool.budget_bytes = 16ull << 20;
    pool.page_bytes = 64ull << 10;
    pool.slab_bytes = 1ull << 20;
    pool.reserve_slabs = 0;
    pool.hugepages = PagePool::Hugepages::kOff;
    pool.pretouch_threads = 1;
    auto created = PagePool::Create(pool);
    if (!created.ok()) Fail("PagePool::Create: " + created.status().ToString());
    SessionManager::Options options;
    options.max_sessions = 8;
    options.max_requests_per_session = 64;
    options.fd_socket_path = "/nonexistent/fuzz.sock.fd";
    options.max_lease_seconds = kMaxLease;
    options.clock = [] { return absl::FromUnixSeconds(FakeNow()); };
    return new SessionManager(options, std::move(*created));
  }();
  return *manager;
}

namespace {

// HISPARSE_FUZZ_TRACE=1: each op's byte and the node's figures after it, on stderr (a corpus
// file's transcript: two builds replay a file the same when their transcripts are equal).
bool Tracing() {
  static const bool on = [] {
    const char* v = std::getenv("HISPARSE_FUZZ_TRACE");
    return v != nullptr && v[0] == '1';
  }();
  return on;
}

void Trace(const v1::StatsResponse& st) {
  std::fprintf(stderr, "  sessions %u requests %u parked %u pages %llu admissions %llu rejections %llu\n",
               st.sessions(), st.requests(), st.parked_requests(),
               static_cast<unsigned long long>(st.host_pool().pages_used()),
               static_cast<unsigned long long>(st.admissions()), static_cast<unsigned long long>(st.rejections()));
}

}  // namespace

// Picks a session reference: usually a live one with its own token, sometimes a wrong token or
// an id no one holds. `owner` is set when the reference names a live session correctly.
v1::SessionRef PickRef(FuzzInput& in, std::vector<LiveSession>& live, LiveSession** owner) {
  v1::SessionRef ref;
  *owner = nullptr;
  const uint8_t how = in.Read<uint8_t>();
  if (!live.empty() && how % 4 != 3) {
    LiveSession& s = live[in.Read<uint8_t>() % live.size()];
    ref.set_session_id(s.id);
    if (how % 4 == 2) {
      ref.set_token(in.String(40));
      if (ref.token() == s.token) *owner = &s;
    } else {
      ref.set_token(s.token);
      *owner = &s;
    }
  } else {
    ref.set_session_id(in.Read<uint64_t>());
    ref.set_token(in.String(40));
    for (LiveSession& s : live) {
      if (s.id == ref.session_id() && s.token == ref.token()) *owner = &s;
    }
  }
  return ref;
}

uint64_t PickRequestId(FuzzInput& in) {
  const uint8_t how = in.Read<uint8_t>();
  return how < 240 ? how % 8 : in.Read<uint64_t>();  // mostly a few ids, so they collide
}

namespace {

void OpenOne(FuzzInput& in, std::vector<LiveSession>& live) {
  v1::OpenSession open;
  v1::Geometry* g = open.mutable_geometry();
  g->set_gpu(in.Read<uint8_t>() < 200 ? -1 : static_cast<int32_t>(in.Read<uint32_t>()));
  g->set_num_layers(in.SmallOrRaw(0, 9));
  g->set_record_bytes(in.Read<uint8_t>() < 32 ? in.Read<uint32_t>() : 16 * in.Small(0, 64));
  g->set_k(in.SmallOrRaw(0, 33));
  g->set_slots(in.SmallOrRaw(0, 65));
  g->set_max_requests(in.SmallOrRaw(0, 9));
  open.set_engine_name(in.String(200));
  auto opened = Manager().OpenSession(open, PeerCredentials{::getpid(), ::getuid(), ::getgid()});
  if (!opened.ok()) {
    const absl::StatusCode code = opened.status().code();
    Expect(code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kResourceExhausted ||
               code == absl::StatusCode::kFailedPrecondition,
           "OpenSession failed with an unexpected code: " + opened.status().ToString());
    return;
  }
  for (const LiveSession& s : live) Expect(s.id != opened->session_id(), "a session id was handed out twice");
  LiveSession s;
  s.id = opened->session_id();
  s.token = opened->token();
  s.engine = open.engine_name();
  s.uid = ::getuid();
  live.push_back(std::move(s));
}

bool IsAdmitRefusal(const absl::Status& st) {
  return absl::IsInvalidArgument(st) || absl::IsFailedPrecondition(st) || absl::IsResourceExhausted(st) ||
         absl::IsAlreadyExists(st);
}

// AdmitBatch (either mode, sometimes an invalid one) of up to 12 fuzzed items, checked against the
// model: what it says it admitted is new and held now; all or nothing admits every item or none.
void AdmitBatchOne(FuzzInput& in, std::vector<LiveSession>& live) {
  LiveSession* owner = nullptr;
  v1::AdmitBatchRequest req;
  *req.mutable_session() = PickRef(in, live, &owner);
  const uint8_t mode = in.Read<uint8_t>() % 8;
  req.set_mode(mode == 7 ? v1::BATCH_MODE_UNSPECIFIED
                         : (mode % 2 == 0 ? v1::BATCH_MODE_ALL_OR_NOTHING : v1::BATCH_MODE_PER_ITEM));
  const uint32_t n = in.Small(0, 12);
  for (uint32_t i = 0; i < n; ++i) {
    v1::AdmitItem* item = req.add_items();
    item->set_request_id(PickRequestId(in));
    item->set_token_budget(in.Read<uint8_t>() < 16 ? in.Read<uint32_t>() : in.Small(0, 255) * 64);
    item->set_context_tokens(in.Read<uint8_t>() < 16 ? in.Read<uint32_t>() : item->token_budget() / 2);
  }
  auto r = Manager().AdmitBatch(req);
  if (n == 0 || req.mode() == v1::BATCH_MODE_UNSPECIFIED) {
    Expect(absl::IsInvalidArgument(r.status()), "AdmitBatch of no items or no mode: " + r.status().ToString());
    return;
  }
  if (owner == nullptr) {
    Expect(absl::IsPermissionDenied(r.status()), "AdmitBatch with a foreign or wrong ref: " + r.status().ToString());
    return;
  }
  Expect(r.ok() && r->results_size() == static_cast<int>(n), "AdmitBatch of a live session: " + r.status().ToString());
  if (!r.ok()) return;
  uint32_t admitted = 0;
  for (uint32_t i = 0; i < n; ++i) {
    const v1::AdmitResult& res = r->results(static_cast<int>(i));
    Expect(res.request_id() == req.items(static_cast<int>(i)).request_id(), "AdmitBatch result out of order");
    if (res.has_admitted()) {
      ++admitted;
      Expect(owner->requests.insert(res.request_id()).second, "AdmitBatch admitted an id already held");
      Expect(res.admitted().capacity_tokens() == req.items(static_cast<int>(i)).token_budget(),
             "AdmitBatch capacity differs from the budget");
    } else {
      const absl::Status st(static_cast<absl::StatusCode>(res.error().code()), res.error().message());
      Expect(IsAdmitRefusal(st) || absl::IsAborted(st),
             "AdmitBatch item failed with an undocumented code: " + st.ToString());
    }
  }
  Expect(r->admitted() == admitted, "AdmitBatch's count disagrees with its results");
  if (req.mode() == v1::BATCH_MODE_ALL_OR_NOTHING) {
    Expect(r->failed_item() == 0 ? admitted == n : admitted == 0 && r->failed_item() <= n,
           "an all-or-nothing batch admitted part of its items");
  }
}

// ReleaseBatch of up to 12 fuzzed ids: each released id was held, each NOT_FOUND was not, each
// INVALID_ARGUMENT repeats an earlier id of the batch.
void ReleaseBatchOne(FuzzInput& in, std::vector<LiveSession>& live) {
  LiveSession* owner = nullptr;
  v1::ReleaseBatchRequest req;
  *req.mutable_session() = PickRef(in, live, &owner);
  const uint32_t n = in.Small(0, 12);
  for (uint32_t i = 0; i < n; ++i) req.add_request_ids(PickRequestId(in));
  auto r = Manager().ReleaseBatch(req);
  if (n == 0) {
    Expect(absl::IsInvalidArgument(r.status()), "ReleaseBatch of no ids: " + r.status().ToString());
    return;
  }
  if (owner == nullptr) {
    Expect(absl::IsPermissionDenied(r.status()), "ReleaseBatch with a foreign or wrong ref: " + r.status().ToString());
    return;
  }
  Expect(r.ok() && r->results_size() == static_cast<int>(n),
         "ReleaseBatch of a live session: " + r.status().ToString());
  if (!r.ok()) return;
  std::set<uint64_t> seen;
  for (uint32_t i = 0; i < n; ++i) {
    const uint64_t id = req.request_ids(static_cast<int>(i));
    const auto code = static_cast<absl::StatusCode>(r->results(static_cast<int>(i)).code());
    if (!seen.insert(id).second) {
      Expect(code == absl::StatusCode::kInvalidArgument, "ReleaseBatch of a repeated id was not refused");
    } else if (owner->requests.count(id) == 1) {
      owner->Forget(id);
      Expect(code == absl::StatusCode::kOk, "ReleaseBatch of a held id failed");
    } else {
      Expect(code == absl::StatusCode::kNotFound, "ReleaseBatch of an id not held was not NOT_FOUND");
    }
  }
}

// ParkBatch or ResumeBatch (either mode, sometimes an invalid one) of up to 12 fuzzed ids, checked
// item by item against the model: a repeated id INVALID_ARGUMENT, one not held NOT_FOUND, a parked
// one parked again (or a live one resumed) FAILED_PRECONDITION, a resume OK or RESOURCE_EXHAUSTED;
// all or nothing changes the model only when every item succeeded, else the failing item is the
// first that could not and every other reads ABORTED.
void ParkResumeBatchOne(FuzzInput& in, std::vector<LiveSession>& live, bool park) {
  LiveSession* owner = nullptr;
  const v1::SessionRef ref = PickRef(in, live, &owner);
  const uint32_t n = in.Small(0, 12);
  const auto mode = static_cast<v1::BatchMode>(in.Small(0, 2));
  std::vector<uint64_t> ids;
  for (uint32_t i = 0; i < n; ++i) ids.push_back(PickRequestId(in));
  std::vector<int> codes;
  absl::Status call;
  uint32_t failed_item = 0;
  const auto collect = [&](const auto& r) {
    call = r.status();
    if (!r.ok()) return;
    failed_item = r->failed_item();
    for (const auto& res : r->results()) codes.push_back(res.has_error() ? res.error().code() : 0);
  };
  if (park) {
    v1::ParkBatchRequest req;
    *req.mutable_session() = ref;
    req.set_mode(mode);
    for (uint64_t id : ids) req.add_request_ids(id);
    collect(Manager().ParkBatch(req));
  } else {
    v1::ResumeBatchRequest req;
    *req.mutable_session() = ref;
    req.set_mode(mode);
    for (uint64_t id : ids) req.add_request_ids(id);
    collect(Manager().ResumeBatch(req));
  }
  if (n == 0 || mode == v1::BATCH_MODE_UNSPECIFIED) {
    Expect(absl::IsInvalidArgument(call), "Park/ResumeBatch of no ids or no mode: " + call.ToString());
    return;
  }
  if (owner == nullptr) {
    Expect(absl::IsPermissionDenied(call), "Park/ResumeBatch with a foreign or wrong ref: " + call.ToString());
    return;
  }
  Expect(call.ok() && codes.size() == n, "Park/ResumeBatch of a live session: " + call.ToString());
  if (!call.ok()) return;
  const bool all_or_nothing = mode == v1::BATCH_MODE_ALL_OR_NOTHING;
  const int kAborted = static_cast<int>(absl::StatusCode::kAborted);
  std::set<uint64_t> seen, changed;
  for (uint32_t i = 0; i < n; ++i) {
    const uint64_t id = ids[i];
    int want = 0;
    if (!seen.insert(id).second) {
      want = static_cast<int>(absl::StatusCode::kInvalidArgument);
    } else if (owner->requests.count(id) == 0) {
      want = static_cast<int>(absl::StatusCode::kNotFound);
    } else if (park == (owner->parked.count(id) != 0)) {
      want = static_cast<int>(absl::StatusCode::kFailedPrecondition);
    } else if (!park && codes[i] == static_cast<int>(absl::StatusCode::kResourceExhausted)) {
      want = codes[i];  // no free row: the model does not count rows
    }
    if (all_or_nothing && failed_item != 0 && i + 1 != failed_item) {
      Expect(codes[i] == kAborted, "an item of a failed all-or-nothing batch is not ABORTED");
      if (i + 1 < failed_item) Expect(want == 0, "an all-or-nothing batch failed at a later item than it should");
      continue;
    }
    Expect(codes[i] == want, "Park/ResumeBatch item's code disagrees with the model");
    if (all_or_nothing && failed_item != 0) continue;  // the failing item: it changed nothing
    if (want == 0) changed.insert(id);
  }
  if (all_or_nothing && failed_item != 0) return;  // nothing changed
  for (uint64_t id : changed) {
    if (park) {
      owner->parked.insert(id);
    } else {
      owner->parked.erase(id);
    }
  }
}

// The op an op byte selects, as fuzz_reach.h counts it.
const char* OpKind(uint8_t op) {
  static const char* const kByLastDigit[] = {"open",      "admit", "extend", "release",     "close",
                                             "fd lookup", "stats", "drain",  "park/resume", "shared admit"};
  switch (op) {
    case 240:
      return "durable";
    case 241:
      return "clock";
    case 242:
      return "group open";
    case 243:
      return "group admit";
    default:
      break;
  }
  if (op >= 244 && op < 248) return "batch park/resume";
  if (op >= 248) return op % 2 == 0 ? "admit batch" : "release batch";
  return kByLastDigit[op % 10];
}

void RunOne(FuzzInput& in, Model& m) {
  std::vector<LiveSession>& live = m.live;
  LiveSession* owner = nullptr;
  const uint8_t op = in.Read<uint8_t>();
  Reached(OpKind(op));
  switch (op) {  // the durable and group ops, appended (240..243 were unused aliases of 0..3)
    case 240:
      return DurableOne(in, m);
    case 241:
      return ClockOne(in, m);
    case 242:
      return GroupOpenOne(in, m);
    case 243:
      return GroupAdmitOne(in, m);
    default:
      break;
  }
  if (op >= 244 && op < 248) {  // batched park / resume
    ParkResumeBatchOne(in, live, op % 2 == 0);
    return;
  }
  if (op >= 248) {  // the batched calls
    if (op % 2 == 0) {
      AdmitBatchOne(in, live);
    } else {
      ReleaseBatchOne(in, live);
    }
    return;
  }
  switch (op % 10) {
    case 0:
      OpenOne(in, live);
      break;
    case 1: {  // Admit
      v1::AdmitRequest req;
      *req.mutable_session() = PickRef(in, live, &owner);
      req.set_request_id(PickRequestId(in));
      req.set_token_budget(in.Read<uint8_t>() < 16 ? in.Read<uint32_t>() : in.Small(0, 255) * 64);
      req.set_context_tokens(in.Read<uint8_t>() < 16 ? in.Read<uint32_t>() : req.token_budget() / 2);
      auto r = Manager().Admit(req);
      if (owner == nullptr) {
        Expect(absl::IsPermissionDenied(r.status()), "Admit with a foreign or wrong ref: " + r.status().ToString());
      } else if (r.ok()) {
        Reached("admit accepted");
        Expect(owner->requests.insert(req.request_id()).second, "Admit succeeded for an id already held");
        Expect(r->capacity_tokens() == req.token_budget(), "Admit capacity differs from the budget");
      } else if (owner->requests.count(req.request_id()) != 0) {
        // The id is held: AlreadyExists, unless an earlier check (bad budget, draining) refused
        // first. Never a trip to the allocator.
        Expect(absl::IsAlreadyExists(r.status()) || absl::IsInvalidArgument(r.status()) ||
                   absl::IsFailedPrecondition(r.status()),
               "Admit of a held id: " + r.status().ToString());
      } else {
        Expect(absl::IsInvalidArgument(r.status()) || absl::IsFailedPrecondition(r.status()) ||
                   absl::IsResourceExhausted(r.status()),
               "Admit failed with an undocumented code: " + r.status().ToString());
      }
      break;
    }
    case 2: {  // Extend
      v1::ExtendRequest req;
      *req.mutable_session() = PickRef(in, live, &owner);
      req.set_request_id(PickRequestId(in));
      req.set_token_budget(in.Read<uint8_t>() < 16 ? in.Read<uint32_t>() : in.Small(0, 255) * 64);
      auto r = Manager().Extend(req);
      if (owner == nullptr) {
        Expect(absl::IsPermissionDenied(r.status()), "Extend with a foreign or wrong ref: " + r.status().ToString());
      } else if (owner->requests.count(req.request_id()) == 0) {
        Expect(absl::IsNotFound(r.status()), "Extend of an id not held: " + r.status().ToString());
      } else if (r.ok()) {
        Expect(r->capacity_tokens() == req.token_budget(), "Extend capacity differs from the budget");
      } else {
        Expect(absl::IsInvalidArgument(r.status()) || absl::IsResourceExhausted(r.status()),
               "Extend failed with an undocumented code: " + r.status().ToString());
      }
      break;
    }
    case 3: {  // Release
      v1::ReleaseRequest req;
      *req.mutable_session() = PickRef(in, live, &owner);
      req.set_request_id(PickRequestId(in));
      absl::Status st = Manager().Release(req);
      if (owner == nullptr) {
        Expect(absl::IsPermissionDenied(st), "Release with a foreign or wrong ref: " + st.ToString());
      } else if (owner->requests.count(req.request_id()) == 1) {
        owner->Forget(req.request_id());
        Expect(st.ok(), "Release of a held id failed: " + st.ToString());
      } else {
        Expect(absl::IsNotFound(st), "Release of an id not held: " + st.ToString());
      }
      break;
    }
    case 4: {  // Close (sometimes an id no one holds: a no-op)
      if (!live.empty() && in.Read<uint8_t>() % 8 != 0) {
        CloseInModel(m, in.Read<uint8_t>() % live.size());
      } else {
        const uint64_t id = in.Read<uint64_t>();
        bool held = false;
        for (const LiveSession& s : live) held |= s.id == id;
        if (!held) Manager().CloseSession(id);
      }
      break;
    }
    case 5: {  // The fd channel's lookup
      const v1::SessionRef ref = PickRef(in, live, &owner);
      std::string object;
      switch (in.Read<uint8_t>() % 4) {
        case 0:
          object = "arena";
          break;
        case 1:
          object = "slab " + std::to_string(in.Small(0, 40));
          break;
        case 2:
          object = (in.Read<uint8_t>() % 2 == 0 ? "slab " : "segment ") + in.String(24);
          break;
        default:
          object = in.String(64);
          break;
      }
      auto fd = Manager().DupFdFor(ref.session_id(), ref.token(), object,
                                   PeerCredentials{::getpid(), ::getuid(), ::getgid()});
      if (owner == nullptr) Expect(!fd.ok(), "DupFdFor handed a descriptor to a wrong ref");
      if (fd.ok()) Expect(fd->valid(), "DupFdFor returned OK without a descriptor");
      break;
    }
    case 6: {  // Stats agrees with the model
      const v1::StatsResponse st = Manager().Stats();
      uint32_t requests = 0;
      for (const LiveSession& s : live) requests += static_cast<uint32_t>(s.requests.size());
      Expect(st.sessions() == live.size(), "Stats.sessions disagrees with the model");
      Expect(st.requests() == requests, "Stats.requests disagrees with the model");
      uint32_t parked = 0;
      for (const LiveSession& s : live) parked += static_cast<uint32_t>(s.parked.size());
      Expect(st.parked_requests() == parked, "Stats.parked_requests disagrees with the model");
      CheckDurableStats(m);
      break;
    }
    case 8: {  // Park or Resume
      const v1::SessionRef ref = PickRef(in, live, &owner);
      const uint64_t id = PickRequestId(in);
      const bool park = in.Read<uint8_t>() % 2 == 0;
      absl::Status st;
      if (park) {
        v1::ParkRequest req;
        *req.mutable_session() = ref;
        req.set_request_id(id);
        st = Manager().Park(req).status();
      } else {
        v1::ResumeRequest req;
        *req.mutable_session() = ref;
        req.set_request_id(id);
        st = Manager().Resume(req).status();
      }
      if (owner == nullptr) {
        Expect(absl::IsPermissionDenied(st), "Park/Resume with a foreign or wrong ref: " + st.ToString());
      } else if (owner->requests.count(id) == 0) {
        Expect(absl::IsNotFound(st), "Park/Resume of an id not held: " + st.ToString());
      } else if (park == (owner->parked.count(id) != 0)) {
        Expect(absl::IsFailedPrecondition(st), "Park of a parked / Resume of a live request: " + st.ToString());
      } else if (park) {
        Expect(st.ok(), "Park of a live request failed: " + st.ToString());
        Reached("park accepted");
        owner->parked.insert(id);
      } else if (st.ok()) {
        Reached("resume accepted");
        owner->parked.erase(id);
      } else {
        Expect(absl::IsResourceExhausted(st), "Resume failed with an undocumented code: " + st.ToString());
      }
      break;
    }
    case 9: {  // Admit on a parent's prefix
      v1::AdmitRequest req;
      *req.mutable_session() = PickRef(in, live, &owner);
      req.set_request_id(PickRequestId(in));
      req.set_parent_request_id(PickRequestId(in));
      req.set_token_budget(in.Small(0, 255) * 64);
      req.set_prefix_tokens(in.Read<uint8_t>() < 16 ? in.Read<uint32_t>() : in.Small(0, 255) * 16);
      auto r = Manager().Admit(req);
      if (owner == nullptr) {
        Expect(absl::IsPermissionDenied(r.status()), "Admit with a foreign or wrong ref: " + r.status().ToString());
      } else if (r.ok()) {
        Reached("shared admit accepted");
        if (req.parent_request_id() != 0 || req.prefix_tokens() != 0) {
          Expect(owner->requests.count(req.parent_request_id()) != 0, "a shared Admit succeeded without its parent");
        }
        Expect(owner->requests.insert(req.request_id()).second, "Admit succeeded for an id already held");
      } else {
        Expect(absl::IsInvalidArgument(r.status()) || absl::IsFailedPrecondition(r.status()) ||
                   absl::IsResourceExhausted(r.status()) || absl::IsAlreadyExists(r.status()) ||
                   absl::IsNotFound(r.status()),
               "a shared Admit failed with an undocumented code: " + r.status().ToString());
        if (absl::IsNotFound(r.status())) {
          Expect(owner->requests.count(req.parent_request_id()) == 0, "NotFound for a parent that is held");
        }
      }
      break;
    }
    default:  // Drain on / off: admissions and opens must fail cleanly while draining
      m.draining = in.Read<uint8_t>() % 2 == 1;
      Manager().SetDraining(m.draining);
      break;
  }
}

}  // namespace
}  // namespace hisparse::fuzz

// What the replay holds the corpus to (fuzz_reach.h): every op, and the accepting branch of each
// that can succeed.
HS_FUZZ_STEP_KINDS("open", "admit", "extend", "release", "close", "fd lookup", "stats", "drain", "park/resume",
                   "shared admit", "durable", "clock", "group open", "group admit", "batch park/resume", "admit batch",
                   "release batch", "admit accepted", "park accepted", "resume accepted", "shared admit accepted")

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hisparse;
  using namespace hisparse::fuzz;
  FuzzInput in(data, size);
  Model m;
  FakeNow() = kEpoch;
  Manager().SetDraining(false);
  Manager().SetMaxLeaseSeconds(kMaxLease);
  m.expiries_before = Manager().Stats().lease_expiries();
  for (int op = 0; op < kMaxOps && !in.empty(); ++op) {
    if (Tracing()) std::fprintf(stderr, "op %d: byte %u\n", op, static_cast<unsigned>(in.Peek()));
    RunOne(in, m);
    absl::Status st = Manager().CheckInvariants();
    if (!st.ok()) Fail("invariants broken after op " + std::to_string(op) + ": " + st.ToString());
    if (Tracing()) Trace(Manager().Stats());
  }
  while (!m.live.empty()) CloseInModel(m, m.live.size() - 1);
  Expect(m.groups.empty(), "a group outlived its last member in the model");
  // Every orphan's lease ends (leases last at most kMaxLeaseBound seconds): the sweep releases them all.
  const size_t orphaned = m.OrphanedRequests();
  FakeNow() += kMaxLeaseBound + 1;
  const size_t expired = Manager().ExpireLeases();
  Expect(expired == orphaned, "the final sweep released " + std::to_string(expired) + " orphaned requests, the model " +
                                  std::to_string(orphaned));
  Manager().SetDraining(false);
  const v1::StatsResponse st = Manager().Stats();
  Expect(st.sessions() == 0 && st.requests() == 0, "sessions or requests left after closing every session");
  Expect(st.orphaned_requests() == 0 && st.groups_size() == 0, "orphans or groups left after every lease ended");
  Expect(st.host_pool().used_bytes() == 0,
         "pool used bytes " + std::to_string(st.host_pool().used_bytes()) + " after closing every session");
  Expect(st.host_pool().pages_used() == 0 && st.host_pool().slabs() == 0,
         "pages or slabs still held after closing every session");
  absl::Status inv = Manager().CheckInvariants();
  if (!inv.ok()) Fail("invariants broken after closing every session: " + inv.ToString());
  Manager().WaitPoolIdle();  // released slabs' descriptors are closed by the pool's worker
  return 0;
}
