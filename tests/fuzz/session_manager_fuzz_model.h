// The session-manager fuzzer's shadow model (session_manager_fuzzer.cc): who holds which request,
// which are parked, durable (their lease's end on the fuzzer's clock), orphaned by an ended
// session, or shares of a TP group's request. Each op decodes its bytes, calls the one
// SessionManager, checks the outcome against this model and updates it.
//
// The model and the ops are single-threaded, as libFuzzer runs them; the manager's clock is the
// model's (FakeNow), moved only by the clock op.
#ifndef HISPARSE_TESTS_FUZZ_SESSION_MANAGER_FUZZ_MODEL_H_
#define HISPARSE_TESTS_FUZZ_SESSION_MANAGER_FUZZ_MODEL_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fuzz_input.h"
#include "hisparse/daemon/session_manager.h"

namespace hisparse::fuzz {

// durability.max_lease_seconds at the start of every input (the lease op may change it, up to
// kMaxLeaseBound; the input's end puts it back).
constexpr uint32_t kMaxLease = 100;
constexpr uint32_t kMaxLeaseBound = 120;

struct LiveSession {
  uint64_t id = 0;
  std::string token;
  std::set<uint64_t> requests;  // the shadow model: what this session holds
  std::set<uint64_t> parked;    // of those, the parked ones
  // Of those, the durable ones: the fuzzer clock's second their lease ends (absent: not durable).
  std::map<uint64_t, int64_t> lease_end;
  std::string engine;
  uint32_t uid = 0;   // its tenant
  std::string group;  // its TP group (empty: none)
  // Of `requests`, the shares of a group request, and of those the ones this rank attached.
  std::set<uint64_t> shares, attached;

  // The request left the session (released, evicted with it): out of every set.
  void Forget(uint64_t request_id) {
    requests.erase(request_id);
    parked.erase(request_id);
    lease_end.erase(request_id);
    shares.erase(request_id);
    attached.erase(request_id);
  }
};

// An ended session's durable requests, every one parked, kept until adopted or expired.
struct Orphan {
  std::string engine;
  uint32_t uid = 0;
  std::map<uint64_t, int64_t> lease_end;  // by request id
};

struct ModelGroup {
  uint32_t uid = 0;
  std::vector<uint64_t> ranks;  // rank -> live session id, 0: free
};

struct Model {
  std::vector<LiveSession> live;
  std::map<uint64_t, Orphan> orphans;                             // by the ended session's id
  std::map<std::pair<uint32_t, std::string>, ModelGroup> groups;  // by (tenant uid, name): a tenant's own
  bool draining = false;
  uint32_t max_lease = kMaxLease;
  uint64_t expired = 0;          // orphaned requests the manager released at their lease's end
  uint64_t expiries_before = 0;  // Stats.lease_expiries when the input began (it counts since start)

  LiveSession* Find(uint64_t session_id);
  size_t OrphanedRequests() const;
};

SessionManager& Manager();
// The manager's clock, in whole seconds.
int64_t& FakeNow();

// Picks a session reference: usually a live one with its own token, sometimes a wrong token or
// an id no one holds. `owner` is set when the reference names a live session correctly.
v1::SessionRef PickRef(FuzzInput& in, std::vector<LiveSession>& live, LiveSession** owner);
uint64_t PickRequestId(FuzzInput& in);

// Ends live session `i` in the manager and the model: its durable requests become an orphan, the
// rest (and its group shares) are released, its group rank is freed.
void CloseInModel(Model& m, size_t i);
// The new ops (session_manager_fuzz_durable.cc, session_manager_fuzz_groups.cc).
void DurableOne(FuzzInput& in, Model& m);  // SetLease, Admit with a lease, ListAdoptable, Adopt, the bound
void ClockOne(FuzzInput& in, Model& m);    // the clock moves; maybe the lease sweep
void GroupOpenOne(FuzzInput& in, Model& m);
void GroupAdmitOne(FuzzInput& in, Model& m);
// Stats' durable, orphan and group figures agree with the model.
void CheckDurableStats(const Model& m);

}  // namespace hisparse::fuzz

#endif  // HISPARSE_TESTS_FUZZ_SESSION_MANAGER_FUZZ_MODEL_H_
