// Fuzz target: the fd channel's protocol (FdServer::HandleRequest, the whole of it but the
// socket). The input is a program of request packets, raw bytes or shaped like the protocol
// ("HSFD1|HSFD2 <id> <token> arena|slab <N>") with fuzzed versions, ids, tokens, objects and
// peer uids, answered against one in-process SessionManager holding one live session (bound to
// this process's uid, with one admitted request). Every reply must decode (fd_channel_codec.h) as
// an fd grant with a descriptor or an error without one, and a descriptor may only ever be handed out for the live
// session's exact id and token, to its own uid, and only be its arena or a slab it holds (same
// inode) of the size the reply says. Anything else aborts (a finding).
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <utility>
#include <variant>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "fuzz_check.h"
#include "fuzz_input.h"
#include "fuzz_reach.h"
#include "hisparse/common/fd_channel_codec.h"
#include "hisparse/common/log.h"
#include "hisparse/daemon/fd_server.h"
#include "hisparse/daemon/page_pool.h"
#include "hisparse/daemon/session_manager.h"

namespace hisparse::fuzz {
namespace {

constexpr int kMaxPackets = 64;

std::pair<dev_t, ino_t> Identity(int fd) {
  struct stat st {};
  Expect(::fstat(fd, &st) == 0, "fstat of a handed-out descriptor failed");
  return {st.st_dev, st.st_ino};
}

struct World {
  SessionManager* manager = nullptr;
  uint64_t id = 0;
  std::string token;
  std::set<uint64_t> slabs;                   // the slabs the live request's pages are in
  std::set<std::pair<dev_t, ino_t>> allowed;  // the arena's and those slabs' files
  PeerCredentials owner{::getpid(), ::getuid(), ::getgid()};
};

World& TheWorld() {
  // Leaked on purpose: no destructor ordering against libFuzzer's exit paths.
  static World* const world = [] {
    SetLogThreshold(LogSeverity::kError);
    PagePool::Options pool;
    pool.budget_bytes = 8ull << 20;
    pool.page_bytes = 4096;
    pool.slab_bytes = 1ull << 20;
    pool.reserve_slabs = 0;
    pool.hugepages = PagePool::Hugepages::kOff;
    pool.pretouch_threads = 1;
    auto created = PagePool::Create(pool);
    if (!created.ok()) Fail("PagePool::Create: " + created.status().ToString());
    SessionManager::Options options;
    options.max_sessions = 4;
    options.max_requests_per_session = 8;
    options.fd_socket_path = "/nonexistent/fuzz.sock.fd";
    auto* w = new World;
    w->manager = new SessionManager(options, std::move(*created));
    v1::OpenSession open;
    v1::Geometry* g = open.mutable_geometry();
    g->set_gpu(-1);
    g->set_num_layers(2);
    g->set_record_bytes(64);
    g->set_k(4);
    g->set_slots(8);
    g->set_max_requests(2);
    auto opened = w->manager->OpenSession(open, w->owner);
    if (!opened.ok()) Fail("OpenSession: " + opened.status().ToString());
    w->id = opened->session_id();
    w->token = opened->token();
    // The session belongs to this uid from its open, as an engine's does.
    UniqueFd arena;
    const std::string reply =
        FdServer::HandleRequest(*w->manager, absl::StrCat("HSFD2 ", w->id, " ", w->token, " arena"), w->owner, &arena);
    if (!arena.valid()) Fail("the live session's arena was refused: " + reply);
    w->allowed.insert(Identity(arena.get()));
    v1::AdmitRequest admit;
    admit.mutable_session()->set_session_id(w->id);
    admit.mutable_session()->set_token(w->token);
    admit.set_request_id(1);
    admit.set_token_budget(64);
    admit.set_context_tokens(16);
    auto admitted = w->manager->Admit(admit);
    if (!admitted.ok()) Fail("Admit: " + admitted.status().ToString());
    for (const v1::LayerPages& layer : admitted->layers()) {
      for (const v1::PageRef& p : layer.pages()) {
        if (!w->slabs.insert(p.slab()).second) continue;
        UniqueFd slab;
        FdServer::HandleRequest(*w->manager, absl::StrCat("HSFD2 ", w->id, " ", w->token, " slab ", p.slab()), w->owner,
                                &slab);
        if (!slab.valid()) Fail("a held slab was refused");
        w->allowed.insert(Identity(slab.get()));
      }
    }
    if (w->slabs.empty()) Fail("the admitted request names no slab");
    return w;
  }();
  return *world;
}

std::string PickToken(FuzzInput& in, const World& w) {
  switch (in.Small(0, 3)) {
    case 0:
    case 1:
      return w.token;
    case 2: {  // one byte off
      std::string t = w.token;
      if (!t.empty()) t[in.Read<uint8_t>() % t.size()] ^= static_cast<char>(in.Small(1, 255));
      return t;
    }
    default:
      return in.String(64);
  }
}

std::string PickObject(FuzzInput& in, const World& w) {
  switch (in.Small(0, 4)) {
    case 0:
      return "arena";
    case 1:
      return absl::StrCat("slab ", *std::next(w.slabs.begin(), in.Read<uint8_t>() % w.slabs.size()));
    case 2:
      return absl::StrCat(in.Read<uint8_t>() % 2 == 0 ? "slab " : "segment ", in.Read<uint32_t>() % 16);
    case 3:
      return "slab " + in.String(16);
    default:
      return in.String(64);
  }
}

// A packet shaped like the protocol, off by whatever the input says.
std::string ShapedPacket(FuzzInput& in, const World& w) {
  static const char* const kVersions[] = {"HSFD1", "HSFD2", "HSFD2", "HSFD3", "hsfd2", "HSFD2 "};
  std::string version = kVersions[in.Small(0, 5)];
  const std::string id = in.Read<uint8_t>() < 200 ? absl::StrCat(w.id) : in.String(24);
  const std::string sep = in.Read<uint8_t>() < 240 ? " " : in.String(2);
  return absl::StrCat(version, sep, id, " ", PickToken(in, w), " ", PickObject(in, w));
}

void CheckOne(const World& w, const std::string& packet, const PeerCredentials& peer) {
  UniqueFd fd;
  const std::string reply = FdServer::HandleRequest(*w.manager, packet, peer, &fd);
  // Every reply is one the codec reads back (fd_channel_codec.h), in the form the request's
  // version uses: what the client decodes is what the daemon meant.
  auto decoded = DecodeFdReply(reply, fd.valid());
  Expect(decoded.ok(), "a reply the codec cannot read: " + reply + " (" + decoded.status().ToString() + ")");
  if (!fd.valid()) {
    Expect(std::holds_alternative<FdErr>(*decoded), "a reply without a descriptor that is not an error: " + reply);
    Reached("refused");
    return;
  }
  // A descriptor: only the live session's, for its exact credentials, to its own uid.
  auto request = DecodeFdRequest(packet);
  Expect(request.ok(), "a descriptor for a packet that is no request: " + packet);
  Expect(request->session_id == w.id && request->token == w.token,
         "a descriptor for a request that does not name the live session's id and token: " + packet);
  Expect(peer.uid == w.owner.uid, "a descriptor handed to another uid");
  Expect(w.allowed.count(Identity(fd.get())) == 1, "a descriptor for a file the session does not own: " + packet);
  const FdOk* ok = std::get_if<FdOk>(&*decoded);
  Expect(ok != nullptr && ok->form == FdForm::kFd && reply == EncodeFdReply(*ok, request->version),
         "a descriptor with a reply of another form: " + reply);
  struct stat st {};
  Expect(::fstat(fd.get(), &st) == 0 && static_cast<uint64_t>(st.st_size) == ok->bytes,
         "the reply's size is not the descriptor's: " + reply);
  Reached("descriptor");
}

}  // namespace
}  // namespace hisparse::fuzz

// What the replay holds the corpus to (fuzz_reach.h): packets the server refuses, and packets it
// answers with a descriptor.
HS_FUZZ_STEP_KINDS("refused", "descriptor")

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hisparse::fuzz;  // NOLINT(google-build-using-namespace): the target's own
  World& w = TheWorld();
  FuzzInput in(data, size);
  for (int i = 0; i < kMaxPackets && !in.empty(); ++i) {
    const uint8_t kind = in.Read<uint8_t>();
    hisparse::PeerCredentials peer = w.owner;
    if ((kind & 0x80) != 0) peer.uid = w.owner.uid + 1 + in.Small(0, 3);  // another tenant
    const std::string packet = (kind & 3) == 0 ? in.String(255) : ShapedPacket(in, w);
    CheckOne(w, packet, peer);
  }
  return 0;
}
