// SessionOpener: a session's opening and its memory handed out (session_opener.h).
#include "hisparse/daemon/session_opener.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>
#include <variant>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "hisparse/common/log.h"
#include "hisparse/common/secret.h"
#include "hisparse/common/status_macros.h"
#include "hisparse/common/version_compat.h"
#include "hisparse/daemon/deferred_log.h"
#include "hisparse/daemon/group_requests.h"
#include "hisparse/kernels/arena_layout.h"
#include "hisparse/v1/arena_kind.h"

namespace hisparse {
namespace {

constexpr uint32_t kMaxLayers = 1024;
constexpr int32_t kMaxGpus = 64;
constexpr uint32_t kMaxSlots = 65536;
constexpr uint64_t kMaxArenaBytes = 1ull << 40;

absl::Status ValidateGeometry(const v1::Geometry& g, uint32_t max_requests_limit) {
  auto bad = [](auto... parts) { return absl::InvalidArgumentError(absl::StrCat("geometry.", parts...)); };
  if (g.gpu() < -1 || g.gpu() >= kMaxGpus)
    return bad("gpu must be -1 (host) or a GPU index below ", kMaxGpus, ", got ", g.gpu());
  if (g.num_layers() < 1 || g.num_layers() > kMaxLayers)
    return bad("num_layers must be 1..", kMaxLayers, ", got ", g.num_layers());
  if (g.record_bytes() < kRecordAlign || g.record_bytes() > kMaxRecordBytes || g.record_bytes() % kRecordAlign != 0) {
    return bad("record_bytes must be a multiple of 16 in 16..16384, got ", g.record_bytes());
  }
  if (g.k() < 1) return bad("k must be >= 1, got ", g.k());
  if (g.slots() < g.k()) return bad("slots (B) must be >= k: B = ", g.slots(), ", k = ", g.k());
  if (g.slots() > kMaxSlots) return bad("slots must be <= ", kMaxSlots, ", got ", g.slots());
  if (g.draft_tokens() > static_cast<uint32_t>(kMaxDraftTokens)) {
    return bad("draft_tokens must be 0..", kMaxDraftTokens, ", got ", g.draft_tokens());
  }
  if (g.max_requests() < 1 || g.max_requests() > max_requests_limit) {
    return bad("max_requests must be 1..", max_requests_limit, ", got ", g.max_requests());
  }
  // Shared indexers: every layer names an anchor at or before it that is its own anchor, so a
  // follower's anchor is resolved (and has recorded its miss plan) before the follower runs.
  if (g.layer_anchor_size() != 0) {
    if (g.layer_anchor_size() != static_cast<int>(g.num_layers())) {
      return bad("layer_anchor must be empty or have one entry per layer (", g.num_layers(), "), got ",
                 g.layer_anchor_size());
    }
    for (int l = 0; l < g.layer_anchor_size(); ++l) {
      const int32_t a = g.layer_anchor(l);
      if (a < 0 || a > l) {
        return bad("layer_anchor[", l, "] must be in 0..", l, " (an earlier layer, or itself), got ", a);
      }
      if (g.layer_anchor(a) != a) {
        return bad("layer_anchor[", l, "] = ", a, " names a layer that is not its own anchor (layer_anchor[", a,
                   "] = ", g.layer_anchor(a), ")");
      }
    }
  }
  return absl::OkStatus();
}

// The byte length of the UTF-8 character at text[i], or 0 when none starts there (a stray or
// truncated byte, an overlong form, a surrogate, or a code point above U+10FFFF).
size_t Utf8CharLength(absl::string_view text, size_t i) {
  const auto byte = [&](size_t j) { return static_cast<uint8_t>(text[j]); };
  const uint8_t c = byte(i);
  if (c < 0x80) return 1;
  size_t n;
  uint32_t cp;
  if ((c & 0xe0) == 0xc0) {
    n = 2, cp = c & 0x1f;
  } else if ((c & 0xf0) == 0xe0) {
    n = 3, cp = c & 0x0f;
  } else if ((c & 0xf8) == 0xf0) {
    n = 4, cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > text.size()) return 0;
  for (size_t j = 1; j < n; ++j) {
    if ((byte(i + j) & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (byte(i + j) & 0x3f);
  }
  constexpr uint32_t kMinOf[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMinOf[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return n;
}

// engine_name travels as bytes (a proto3 string with bad UTF-8 would fail to parse, and gRPC would
// answer CANCELLED): it must be UTF-8, and is cut to at most `max` bytes of whole characters, so
// that Stats, which returns it as a string, always serializes.
absl::StatusOr<std::string> EngineName(absl::string_view name, size_t max) {
  size_t keep = 0;
  for (size_t i = 0; i < name.size();) {
    const size_t n = Utf8CharLength(name, i);
    if (n == 0) return absl::InvalidArgumentError(absl::StrCat("engine_name is not UTF-8 (at byte ", i, ")"));
    i += n;
    if (i <= max) keep = i;
  }
  return std::string(name.substr(0, keep));
}

ArenaGeometry ToArenaGeometry(const v1::Geometry& g) {
  // The arena is sized from this: every (row, layer) holds B + 1 + draft_tokens records.
  return ArenaGeometry{static_cast<int32_t>(g.max_requests()),
                       static_cast<int32_t>(g.num_layers()),
                       static_cast<int32_t>(g.slots()),
                       static_cast<int32_t>(g.k()),
                       g.record_bytes(),
                       static_cast<int32_t>(g.draft_tokens())};
}

// The lines a session's opening leaves in the log (written once the node's lock is released).
void LogOpened(DeferredLog& log, const v1::OpenSession& open, const SessionEntry& session, const PeerCredentials& owner,
               bool on_gpu, double create_seconds) {
  const v1::Geometry& g = open.geometry();
  if (open.has_group()) {
    DEFERRED_LOG(log, INFO) << "session " << session.id << " joined group \"" << open.group().name() << "\" as rank "
                            << open.group().rank() << " of " << open.group().size();
  }
  const std::string where =
      on_gpu ? absl::StrCat("on GPU ", session.device,
                            g.gpu_uuid().empty()
                                ? std::string()
                                : absl::StrCat(" (", GpuUuidText(g.gpu_uuid()), ", the engine's GPU ", g.gpu(), ")"))
             : std::string("in host memory");
  DEFERRED_LOG(log, INFO) << "session " << session.id << " opened by pid " << owner.pid << " uid " << owner.uid << " ("
                          << session.engine_name << "): layers " << g.num_layers() << ", record " << g.record_bytes()
                          << " B, k " << g.k() << ", B " << g.slots() << ", rows " << g.max_requests() << ", arena "
                          << session.arena_bytes << " B " << where << " shared as "
                          << v1::ArenaKindName(session.arena->kind()) << " (created in " << create_seconds * 1e3
                          << " ms)";
}

}  // namespace

SessionOpener::SessionOpener(SessionCore& core) : core_(core) {}

absl::StatusOr<int> SessionOpener::DaemonGpuOf(const v1::Geometry& g, bool on_gpu) const {
  if (!g.gpu_uuid().empty() && g.gpu_uuid().size() != 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("geometry.gpu_uuid must be a GPU's 16-byte UUID, got ", g.gpu_uuid().size(), " bytes"));
  }
  // A host arena, an engine that sends no UUID (the two agree on ordinals), or a daemon that could
  // not read its GPUs' UUIDs (logged at start): the ordinal as given.
  if (!on_gpu || g.gpu_uuid().empty() || core_.options_.gpu_uuids.empty()) return g.gpu();
  for (size_t i = 0; i < core_.options_.gpu_uuids.size(); ++i) {
    if (core_.options_.gpu_uuids[i] == g.gpu_uuid()) return static_cast<int>(i);
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "the engine's GPU ", g.gpu(), " (", GpuUuidText(g.gpu_uuid()), ") is not one of the ",
      core_.options_.gpu_uuids.size(),
      " GPUs this daemon sees: give the daemon every GPU of the node (its pod no GPU limit, "
      "NVIDIA_VISIBLE_DEVICES=all), or have the engine keep a private arena (HISPARSE_PRIVATE_GPU_ARENA=1)"));
}

absl::StatusOr<std::unique_ptr<Arena>> SessionOpener::CreateArena(bool on_gpu, int gpu,
                                                                  const ArenaOffsets& layout) const {
  // A host memfd's pages materialize as the engine uses them; a GPU arena is allocated, zeroed and
  // exported now.
  if (!on_gpu) return MakeHostArena(layout);
  absl::StatusOr<std::unique_ptr<GpuArena>> allocated = core_.options_.gpu_arena_allocator(gpu, layout.total_bytes);
  if (!allocated.ok()) return allocated.status();
  return WrapGpuArena(std::move(*allocated), layout.counters);
}
struct SessionOpener::OpenPlan {
  uint64_t page_bytes;
  uint32_t max_context;  // tokens a request may hold
  std::string engine_name;
  ArenaOffsets layout;
  bool on_gpu;  // the arena in GPU `device`'s memory, else a host memfd
  int device;
};

absl::StatusOr<SessionOpener::OpenPlan> SessionOpener::PlanOpen(const v1::OpenSession& open) const {
  uint32_t max_requests_limit;
  uint64_t page_bytes;
  {
    NodeLock lock(core_);
    max_requests_limit = core_.options_.max_requests_per_session;
    page_bytes = core_.ledger_.page_bytes();
  }
  HS_RETURN_IF_ERROR(CheckClientVersion(open.client_version(), core_.options_.version));
  HS_RETURN_IF_ERROR(ValidateGeometry(open.geometry(), max_requests_limit));
  if (open.geometry().record_bytes() > page_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("geometry.record_bytes (", open.geometry().record_bytes(),
                                                   ") exceeds the host pool's page (host_pool.page_size, ", page_bytes,
                                                   " bytes): a record never straddles a page"));
  }
  const uint32_t max_context = open.geometry().max_context_tokens() == 0 ? core_.options_.max_tokens_per_request
                                                                         : open.geometry().max_context_tokens();
  if (max_context > core_.options_.max_tokens_per_request) {
    return absl::InvalidArgumentError(absl::StrCat("geometry.max_context_tokens (", max_context,
                                                   ") exceeds the daemon's limits.max_tokens_per_request (",
                                                   core_.options_.max_tokens_per_request, ")"));
  }
  HS_ASSIGN_OR_RETURN(std::string engine_name, EngineName(open.engine_name(), 128));
  if (open.has_group()) HS_RETURN_IF_ERROR(TpGroups::Validate(open.group()));  // tp_groups.h
  const ArenaOffsets layout = ComputeArenaOffsets(ToArenaGeometry(open.geometry()));
  if (layout.total_bytes > kMaxArenaBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("geometry asks for a ", layout.total_bytes, "-byte slot arena; the limit is ", kMaxArenaBytes));
  }
  // Set at construction only: readable without the lock.
  const bool on_gpu = open.geometry().gpu() >= 0 && core_.options_.gpu_arena_allocator != nullptr;
  HS_ASSIGN_OR_RETURN(const int device, DaemonGpuOf(open.geometry(), on_gpu));
  return OpenPlan{page_bytes, max_context, std::move(engine_name), layout, on_gpu, device};
}

absl::Status SessionOpener::ReserveArenaLocked(const v1::OpenSession& open, const OpenPlan& plan,
                                               const SessionEntry& session, uint32_t uid) {
  const uint64_t bytes = plan.layout.total_bytes;
  if (core_.draining_)
    return core_.Reject(RejectReason::kDraining,
                        absl::FailedPreconditionError("the daemon is draining: no new sessions"));
  if (core_.sessions_.size() >= core_.options_.max_sessions) {
    return core_.Reject(RejectReason::kSessionLimit,
                        absl::ResourceExhaustedError(
                            absl::StrCat("the daemon holds its limit of ", core_.options_.max_sessions, " sessions")));
  }
  if (open.has_group()) HS_RETURN_IF_ERROR(core_.groups_.CheckJoin(session, open.group(), plan.max_context));
  if (std::optional<Refusal> refusal = core_.ledger_.CheckOpenSession(uid, bytes)) {
    return core_.Reject(*std::move(refusal));
  }
  // The budget may have been lowered (SIGHUP) below what is held already.
  const uint64_t host_arena_left = core_.options_.host_arena_budget_bytes -
                                   std::min(core_.host_arena_bytes_, core_.options_.host_arena_budget_bytes);
  if (!plan.on_gpu && bytes > host_arena_left) {
    return core_.Reject(RejectReason::kHostArenaBudget,
                        absl::ResourceExhaustedError(absl::StrCat(
                            "the host slot arena (", bytes,
                            " bytes) exceeds what is left of the node's host-arena budget: ", host_arena_left, " of ",
                            core_.options_.host_arena_budget_bytes, " bytes (limits.host_arena_bytes)")));
  }
  uint64_t& device_bytes = core_.arena_bytes_by_device_[plan.device];
  if (core_.options_.arena_budget_bytes != 0 && device_bytes + bytes > core_.options_.arena_budget_bytes) {
    return core_.Reject(RejectReason::kArenaBudget,
                        absl::ResourceExhaustedError(absl::StrCat(
                            "the slot arena (", bytes, " bytes) exceeds what is left of device ", plan.device,
                            "'s budget (", core_.options_.arena_budget_bytes - device_bytes, " bytes)")));
  }
  device_bytes += bytes;
  if (!plan.on_gpu) core_.host_arena_bytes_ += bytes;
  return absl::OkStatus();
}

void SessionOpener::ReturnArenaLocked(const OpenPlan& plan) {
  core_.arena_bytes_by_device_[plan.device] -= plan.layout.total_bytes;
  if (!plan.on_gpu) core_.host_arena_bytes_ -= plan.layout.total_bytes;
}

v1::SessionOpened SessionOpener::OpenedLocked(const SessionEntry& session, uint64_t page_bytes,
                                              double create_seconds) const {
  v1::SessionOpened opened;
  opened.set_session_id(session.id);
  opened.set_token(session.token);
  opened.set_fd_socket(core_.options_.fd_socket_path);
  v1::SetArenaKind(session.arena->kind(), opened.mutable_arena());
  opened.mutable_arena()->set_bytes(session.arena_bytes);
  opened.mutable_arena()->set_create_seconds(create_seconds);
  opened.set_page_bytes(page_bytes);
  opened.set_records_per_page(session.records_per_page);
  opened.set_pages_per_entry(session.pages_per_entry);
  opened.set_max_tokens_per_request(static_cast<uint32_t>(
      std::min<uint64_t>(uint64_t{session.records_per_page} * session.pages_per_entry, INT32_MAX)));
  opened.set_daemon_version(core_.options_.version);
  opened.set_slab_retired_notices(true);
  opened.set_daemon_instance(core_.instance_);
  return opened;
}

absl::StatusOr<v1::SessionOpened> SessionOpener::Open(const v1::OpenSession& open, const PeerCredentials& owner) {
  HS_ASSIGN_OR_RETURN(OpenPlan plan, PlanOpen(open));
  auto session = std::make_unique<SessionEntry>();
  session->token = NewSecret128();
  session->engine_name = std::move(plan.engine_name);
  session->geometry = open.geometry();
  session->records_per_page =
      static_cast<uint32_t>(std::min<uint64_t>(plan.page_bytes / open.geometry().record_bytes(), INT32_MAX));
  session->pages_per_entry =
      static_cast<uint32_t>((uint64_t{plan.max_context} + session->records_per_page - 1) / session->records_per_page);
  session->peer_pid = owner.pid;
  session->tenant_uid = owner.uid;
  session->device = plan.device;
  {
    NodeLock lock(core_);
    HS_RETURN_IF_ERROR(ReserveArenaLocked(open, plan, *session, owner.uid));
    session->id = core_.next_session_id_++;
  }
  // The arena is created outside the lock: it can take a while and touches no shared state. A
  // host memfd's pages materialize as the engine uses them; a GPU arena is allocated, zeroed and
  // exported now.
  const absl::Time create_start = absl::Now();
  absl::StatusOr<std::unique_ptr<Arena>> arena = CreateArena(plan.on_gpu, plan.device, plan.layout);
  const double create_seconds = absl::ToDoubleSeconds(absl::Now() - create_start);
  DeferredLog log;  // written once the lock is released
  NodeLock lock(core_);
  if (!arena.ok()) {
    ReturnArenaLocked(plan);
    return arena.status();
  }
  session->arena = *std::move(arena);
  session->arena_bytes = session->arena->bytes();
  // Checked again with what the allocator took, atomically with the session's insertion below:
  // two sessions opened at once by one tenant cannot both slip under its quota.
  if (std::optional<Refusal> refusal = core_.ledger_.CheckOpenSession(owner.uid, session->arena_bytes)) {
    ReturnArenaLocked(plan);
    return core_.Reject(*std::move(refusal));
  }
  // Checked again, atomically with the insertion: two sessions racing for one rank.
  if (absl::Status joined = open.has_group()
                                ? core_.groups_.Join(*session, open.group(), plan.max_context, &core_.next_session_id_)
                                : absl::OkStatus();
      !joined.ok()) {
    ReturnArenaLocked(plan);
    return joined;
  }
  // The budget was checked against the geometry's bytes; account what the allocator really took
  // (a GPU arena is rounded up to the VMM granularity, 2 MiB on current GPUs).
  core_.arena_bytes_by_device_[plan.device] += session->arena_bytes - plan.layout.total_bytes;
  v1::SessionOpened opened = OpenedLocked(*session, plan.page_bytes, create_seconds);
  LogOpened(log, open, *session, owner, plan.on_gpu, create_seconds);
  session->requests =
      RequestTable::Open(&core_.ledger_, session->id, owner.uid, open.geometry().max_requests(), session->arena_bytes);
  core_.sessions_.emplace(session->id, std::move(session));
  return opened;
}

absl::Status SessionOpener::CheckOwner(const v1::SessionRef& ref, uint32_t uid) const {
  NodeLock lock(core_);
  HS_ASSIGN_OR_RETURN(const SessionEntry* s, core_.FindLocked(ref));
  if (s->tenant_uid != uid) {
    return absl::PermissionDeniedError(absl::StrCat("session ", ref.session_id(), " belongs to uid ", s->tenant_uid,
                                                    ", not to the caller's uid ", uid));
  }
  return absl::OkStatus();
}

absl::StatusOr<UniqueFd> SessionOpener::DupFdFor(uint64_t session_id, const std::string& token, const FdObject& object,
                                                 const PeerCredentials& peer, uint64_t* bytes,
                                                 std::string* ipc_handle) {
  if (bytes != nullptr) *bytes = 0;
  if (ipc_handle != nullptr) ipc_handle->clear();
  std::shared_ptr<const Arena> arena;
  {
    NodeLock lock(core_);
    v1::SessionRef ref;
    ref.set_session_id(session_id);
    ref.set_token(token);
    HS_ASSIGN_OR_RETURN(SessionEntry * s, core_.FindLocked(ref));
    // The session's owner (bound at OpenSession) alone may map its memory: a token that leaked to
    // another user is worth nothing to them.
    if (s->tenant_uid != peer.uid) {
      return absl::PermissionDeniedError(
          absl::StrCat("session ", s->id, " belongs to uid ", s->tenant_uid, ", not uid ", peer.uid));
    }
    if (const auto* slab = std::get_if<FdSlab>(&object)) {
      // A slab is the session's for its whole life: the pool refuses any other's. A member of a TP
      // group may also map its group's slabs.
      // The descriptor leaves the daemon: when the slab retires, what the engine may still hold of
      // it counts against this tenant until the pool sees it freed.
      absl::StatusOr<UniqueFd> fd = core_.pool_->DupSlabFd(session_id, slab->n, bytes, s->tenant_uid);
      if (absl::IsPermissionDenied(fd.status()) && !s->group.empty())
        return GroupRequests::DupSlabLocked(core_, *s, slab->n, bytes);
      return fd;
    }
    arena = s->arena;
  }
  // Exported outside the lock (a GPU arena's export is a driver call); the arena stays alive
  // while it is held here, even if the session closes meanwhile.
  HS_ASSIGN_OR_RETURN(ExportedArena exported, arena->Export());
  if (exported.grant.form == FdForm::kCudaIpc) {
    if (ipc_handle == nullptr) {
      return absl::FailedPreconditionError(
          "this session's GPU arena is shared as a cudaIpc handle, which this request form cannot carry "
          "(fetch it with HSFD2)");
    }
    *ipc_handle = std::move(exported.grant.handle);
  }
  if (bytes != nullptr) *bytes = exported.grant.bytes;
  return std::move(exported.fd);
}

void SessionOpener::SetEventSink(uint64_t session_id, SessionEventSink sink) {
  NodeLock lock(core_);
  auto it = core_.sessions_.find(session_id);
  if (it != core_.sessions_.end()) it->second->sink = std::make_shared<SessionEventSink>(std::move(sink));
}

}  // namespace hisparse
