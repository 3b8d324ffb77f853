// Sessions, admission and release: see session_manager.h.
#include "hisparse/daemon/session_manager.h"

#include <fcntl.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>
#include <variant>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "hisparse/common/log.h"
#include "hisparse/common/secret.h"
#include "hisparse/common/status_macros.h"
#include "hisparse/common/version_compat.h"
#include "hisparse/daemon/deferred_log.h"
#include "hisparse/kernels/arena_layout.h"
#include "hisparse/v1/arena_kind.h"

namespace hisparse {
namespace {

constexpr uint32_t kMaxLayers = 1024;
constexpr int32_t kMaxGpus = 64;
constexpr uint32_t kMaxSlots = 65536;
constexpr uint64_t kMaxArenaBytes = 1ull << 40;

// Constant-time comparison: the token is a capability.
bool TokenEquals(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

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

}  // namespace

absl::StatusOr<int> SessionManager::DaemonGpuOf(const v1::Geometry& g, bool on_gpu) const {
  if (!g.gpu_uuid().empty() && g.gpu_uuid().size() != 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("geometry.gpu_uuid must be a GPU's 16-byte UUID, got ", g.gpu_uuid().size(), " bytes"));
  }
  // A host arena, an engine that sends no UUID (the two agree on ordinals), or a daemon that could
  // not read its GPUs' UUIDs (logged at start): the ordinal as given.
  if (!on_gpu || g.gpu_uuid().empty() || options_.gpu_uuids.empty()) return g.gpu();
  for (size_t i = 0; i < options_.gpu_uuids.size(); ++i) {
    if (options_.gpu_uuids[i] == g.gpu_uuid()) return static_cast<int>(i);
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "the engine's GPU ", g.gpu(), " (", GpuUuidText(g.gpu_uuid()), ") is not one of the ", options_.gpu_uuids.size(),
      " GPUs this daemon sees: give the daemon every GPU of the node (its pod no GPU limit, "
      "NVIDIA_VISIBLE_DEVICES=all), or have the engine keep a private arena (HISPARSE_PRIVATE_GPU_ARENA=1)"));
}

absl::StatusOr<std::unique_ptr<Arena>> SessionManager::CreateArena(bool on_gpu, int gpu,
                                                                   const ArenaOffsets& layout) const {
  // A host memfd's pages materialize as the engine uses them; a GPU arena is allocated, zeroed and
  // exported now.
  if (!on_gpu) return MakeHostArena(layout);
  absl::StatusOr<std::unique_ptr<GpuArena>> allocated = options_.gpu_arena_allocator(gpu, layout.total_bytes);
  if (!allocated.ok()) return allocated.status();
  return WrapGpuArena(std::move(*allocated), layout.counters);
}

SessionManager::SessionManager(const Options& options, std::unique_ptr<PagePool> pool)
    : options_(options),
      pool_(std::move(pool)),
      pool_unlocked_(pool_.get()),
      // Retired slabs an engine may still hold count against its tenant's host quota until the
      // pool sees them freed (page_pool.h); the pool is thread-safe and outlives the ledger.
      ledger_(options.quotas, pool_->page_bytes(), options.clock ? options.clock : AdmissionLedger::Clock(absl::Now),
              [pool = pool_.get()](uint32_t tenant) { return pool->RetiredBytesOf(tenant); }),
      pages_(pool_.get()),
      durable_(options.max_lease_seconds, options.max_orphans_per_tenant) {
  absl::MutexLock lock(&mu_);
  next_session_id_ = std::max<uint64_t>(options.first_session_id, 1);
  if (options.journal != nullptr) {
    // A slab the pool drops leaves the fd store too (on the pool's worker, outside every lock).
    pool_->SetSlabDroppedHook([journal = options.journal](uint64_t slab) { journal->SlabGone(slab); });
  }
}

SessionManager::~SessionManager() = default;

absl::StatusOr<v1::SessionOpened> SessionManager::OpenSession(const v1::OpenSession& open,
                                                              const PeerCredentials& owner) {
  uint32_t max_requests_limit;
  uint64_t page_bytes;
  {
    absl::MutexLock lock(&mu_);
    max_requests_limit = options_.max_requests_per_session;
    page_bytes = ledger_.page_bytes();
  }
  HS_RETURN_IF_ERROR(CheckClientVersion(open.client_version(), options_.version));
  HS_RETURN_IF_ERROR(ValidateGeometry(open.geometry(), max_requests_limit));
  if (open.geometry().record_bytes() > page_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("geometry.record_bytes (", open.geometry().record_bytes(),
                                                   ") exceeds the host pool's page (host_pool.page_size, ", page_bytes,
                                                   " bytes): a record never straddles a page"));
  }
  const uint32_t max_context = open.geometry().max_context_tokens() == 0 ? options_.max_tokens_per_request
                                                                         : open.geometry().max_context_tokens();
  if (max_context > options_.max_tokens_per_request) {
    return absl::InvalidArgumentError(absl::StrCat("geometry.max_context_tokens (", max_context,
                                                   ") exceeds the daemon's limits.max_tokens_per_request (",
                                                   options_.max_tokens_per_request, ")"));
  }
  HS_ASSIGN_OR_RETURN(std::string engine_name, EngineName(open.engine_name(), 128));
  if (open.has_group()) HS_RETURN_IF_ERROR(TpGroups::Validate(open.group()));  // tp_groups.h
  const ArenaOffsets layout = ComputeArenaOffsets(ToArenaGeometry(open.geometry()));
  if (layout.total_bytes > kMaxArenaBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("geometry asks for a ", layout.total_bytes, "-byte slot arena; the limit is ", kMaxArenaBytes));
  }
  // Set at construction only: readable without the lock.
  const bool on_gpu = open.geometry().gpu() >= 0 && options_.gpu_arena_allocator != nullptr;
  HS_ASSIGN_OR_RETURN(const int device, DaemonGpuOf(open.geometry(), on_gpu));
  auto session = std::make_unique<Session>();
  session->token = NewSecret128();
  session->engine_name = std::move(engine_name);
  session->geometry = open.geometry();
  session->records_per_page =
      static_cast<uint32_t>(std::min<uint64_t>(page_bytes / open.geometry().record_bytes(), INT32_MAX));
  session->pages_per_entry =
      static_cast<uint32_t>((uint64_t{max_context} + session->records_per_page - 1) / session->records_per_page);
  session->peer_pid = owner.pid;
  session->tenant_uid = owner.uid;
  session->device = device;
  {
    absl::MutexLock lock(&mu_);
    if (draining_)
      return Reject(RejectReason::kDraining, absl::FailedPreconditionError("the daemon is draining: no new sessions"));
    if (sessions_.size() >= options_.max_sessions) {
      return Reject(RejectReason::kSessionLimit,
                    absl::ResourceExhaustedError(
                        absl::StrCat("the daemon holds its limit of ", options_.max_sessions, " sessions")));
    }
    if (open.has_group()) HS_RETURN_IF_ERROR(groups_.CheckJoin(*session, open.group(), max_context));
    if (std::optional<Refusal> refusal = ledger_.CheckOpenSession(owner.uid, layout.total_bytes)) {
      return Reject(*std::move(refusal));
    }
    // The budget may have been lowered (SIGHUP) below what is held already.
    const uint64_t host_arena_left =
        options_.host_arena_budget_bytes - std::min(host_arena_bytes_, options_.host_arena_budget_bytes);
    if (!on_gpu && layout.total_bytes > host_arena_left) {
      return Reject(RejectReason::kHostArenaBudget,
                    absl::ResourceExhaustedError(absl::StrCat("the host slot arena (", layout.total_bytes,
                                                              " bytes) exceeds what is left of the node's "
                                                              "host-arena budget: ",
                                                              host_arena_left, " of ", options_.host_arena_budget_bytes,
                                                              " bytes (limits.host_arena_bytes)")));
    }
    uint64_t& device_bytes = arena_bytes_by_device_[device];
    if (options_.arena_budget_bytes != 0 && device_bytes + layout.total_bytes > options_.arena_budget_bytes) {
      return Reject(RejectReason::kArenaBudget,
                    absl::ResourceExhaustedError(
                        absl::StrCat("the slot arena (", layout.total_bytes, " bytes) exceeds what is left of device ",
                                     device, "'s budget (", options_.arena_budget_bytes - device_bytes, " bytes)")));
    }
    device_bytes += layout.total_bytes;
    if (!on_gpu) host_arena_bytes_ += layout.total_bytes;
    session->id = next_session_id_++;
  }
  // The arena is created outside the lock: it can take a while and touches no shared state. A
  // host memfd's pages materialize as the engine uses them; a GPU arena is allocated, zeroed and
  // exported now.
  absl::Status arena_status;
  const absl::Time create_start = absl::Now();
  absl::StatusOr<std::unique_ptr<Arena>> arena = CreateArena(on_gpu, device, layout);
  if (arena.ok()) {
    session->arena = std::move(*arena);
    session->arena_bytes = session->arena->bytes();
  } else {
    arena_status = arena.status();
  }
  const double create_seconds = absl::ToDoubleSeconds(absl::Now() - create_start);
  DeferredLog log;  // written once the lock is released
  absl::MutexLock lock(&mu_);
  if (!arena_status.ok()) {
    arena_bytes_by_device_[device] -= layout.total_bytes;
    if (!on_gpu) host_arena_bytes_ -= layout.total_bytes;
    return arena_status;
  }
  // Checked again with what the allocator took, atomically with the session's insertion below:
  // two sessions opened at once by one tenant cannot both slip under its quota.
  if (std::optional<Refusal> refusal = ledger_.CheckOpenSession(owner.uid, session->arena_bytes)) {
    arena_bytes_by_device_[device] -= layout.total_bytes;
    if (!on_gpu) host_arena_bytes_ -= layout.total_bytes;
    return Reject(*std::move(refusal));
  }
  // Checked again, atomically with the insertion: two sessions racing for one rank.
  if (absl::Status joined =
          open.has_group() ? groups_.Join(*session, open.group(), max_context, &next_session_id_) : absl::OkStatus();
      !joined.ok()) {
    arena_bytes_by_device_[device] -= layout.total_bytes;
    if (!on_gpu) host_arena_bytes_ -= layout.total_bytes;
    return joined;
  }
  // The budget was checked against the geometry's bytes; account what the allocator really took
  // (a GPU arena is rounded up to the VMM granularity, 2 MiB on current GPUs).
  arena_bytes_by_device_[device] += session->arena_bytes - layout.total_bytes;
  v1::SessionOpened opened;
  opened.set_session_id(session->id);
  opened.set_token(session->token);
  opened.set_fd_socket(options_.fd_socket_path);
  v1::SetArenaKind(session->arena->kind(), opened.mutable_arena());
  opened.mutable_arena()->set_bytes(session->arena_bytes);
  opened.mutable_arena()->set_create_seconds(create_seconds);
  opened.set_page_bytes(page_bytes);
  opened.set_records_per_page(session->records_per_page);
  opened.set_pages_per_entry(session->pages_per_entry);
  opened.set_max_tokens_per_request(static_cast<uint32_t>(
      std::min<uint64_t>(uint64_t{session->records_per_page} * session->pages_per_entry, INT32_MAX)));
  opened.set_daemon_version(options_.version);
  opened.set_slab_retired_notices(true);
  opened.set_daemon_instance(instance_);
  if (open.has_group()) {
    DEFERRED_LOG(log, INFO) << "session " << session->id << " joined group \"" << open.group().name() << "\" as rank "
                            << open.group().rank() << " of " << open.group().size();
  }
  DEFERRED_LOG(log, INFO) << "session " << session->id << " opened by pid " << owner.pid << " uid " << owner.uid << " ("
                          << session->engine_name << "): layers " << open.geometry().num_layers() << ", record "
                          << open.geometry().record_bytes() << " B, k " << open.geometry().k() << ", B "
                          << open.geometry().slots() << ", rows " << open.geometry().max_requests() << ", arena "
                          << session->arena_bytes << " B "
                          << (on_gpu
                                  ? absl::StrCat("on GPU ", device,
                                                 open.geometry().gpu_uuid().empty()
                                                     ? std::string()
                                                     : absl::StrCat(" (", GpuUuidText(open.geometry().gpu_uuid()),
                                                                    ", the engine's GPU ", open.geometry().gpu(), ")"))
                                  : std::string("in host memory"))
                          << " shared as " << v1::ArenaKindName(session->arena->kind()) << " (created in "
                          << create_seconds * 1e3 << " ms)";
  session->requests =
      RequestTable::Open(&ledger_, session->id, owner.uid, open.geometry().max_requests(), session->arena_bytes);
  sessions_.emplace(session->id, std::move(session));
  return opened;
}

void SessionManager::CloseSession(uint64_t session_id) {
  const FlushJournalOnReturn flush{this};  // a durable request's change is journaled before the answer
  RevokeImportsOf(session_id);             // before its pages are freed (session_import.cc)
  std::unique_ptr<Session> dead;
  size_t released = 0;
  std::function<void()> on_idle;
  DeferredLog log;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(session_id);
    if (it == sessions_.end()) return;
    dead = std::move(it->second);
    sessions_.erase(it);
    // Its requests released, but for durable ones, which stay as an orphan (session_durable.cc);
    // its idle slabs leave it (dropped outside the lock). Then its rank of a TP group is freed
    // (session_groups.cc; a group request is never durable, so none went to the orphan).
    released = EndSessionLocked(*dead, log);
    if (std::optional<uint64_t> ended = groups_.Leave(*dead)) pool_->RetireIdleOf(*ended);  // its last member
    arena_bytes_by_device_[dead->device] -= dead->arena_bytes;
    if (dead->arena->in_host_memory()) host_arena_bytes_ -= dead->arena_bytes;
    on_idle = TakeIdleCallbackLocked();
  }
  log.Flush();
  // The arena (memfd and mapping, or the GPU allocation) goes with `dead`, outside the lock: the
  // daemon's GPU memory is released here, and the GPU's once the engine's import is gone too (an
  // engine that died has lost it already). A Stats call in flight may hold the GPU arena a moment.
  dead.reset();
  LOG(INFO) << "session " << session_id << " closed: released " << released << " requests";
  if (on_idle) on_idle();
}

absl::Status SessionManager::Reject(RejectReason reason, absl::Status status) {
  ++rejections_;
  ++rejections_by_reason_[RejectReasonName(reason)];
  return status;
}

std::function<void()> SessionManager::TakeIdleCallbackLocked() {
  if (!draining_ || !sessions_.empty() || !on_idle_) return {};
  return std::exchange(on_idle_, nullptr);
}

absl::StatusOr<SessionManager::Session*> SessionManager::FindLocked(const v1::SessionRef& ref) {
  auto it = sessions_.find(ref.session_id());
  if (it == sessions_.end() || !TokenEquals(it->second->token, ref.token())) {
    return absl::PermissionDeniedError(
        absl::StrCat("session ", ref.session_id(), " is not a live session of this caller"));
  }
  return it->second.get();
}

void SessionManager::ReleaseRequestLocked(Session& s, Request& r) {
  const uint64_t id = r.id;
  JournalTouchLocked(s, r);  // a Forget, when the journal holds it
  if (r.in_group) {
    ReleaseGroupShareLocked(s, r);  // session_groups.cc
  } else {
    UnshareLocked(s, r);
    for (const std::vector<PagePool::Page>& layer : r.pages) {
      absl::Status st = pool_->ReleaseAll(s.id, layer);
      if (!st.ok()) LOG(ERROR) << "accounting error releasing pages of session " << s.id << ": " << st;
    }
    r.pages.clear();
  }
  s.requests.Erase(id);
}

void SessionManager::FillLayers(const Session& s, const Request& r,
                                google::protobuf::RepeatedPtrField<v1::LayerPages>* out) const {
  const uint64_t page_bytes = pool_->page_bytes();  // const in the pool
  for (size_t layer = 0; layer < r.pages.size(); ++layer) {
    v1::LayerPages* lp = out->Add();
    lp->set_layer(static_cast<uint32_t>(layer));
    for (const PagePool::Page& p : r.pages[layer]) {
      v1::PageRef* ref = lp->add_pages();
      ref->set_slab(p.slab);
      ref->set_offset(uint64_t{p.index} * page_bytes);
      if (s.sharers.IsShared(p)) ref->set_read_only(true);
    }
  }
}

uint64_t SessionManager::PagesFor(const Session& s, uint64_t tokens) {
  return (tokens + s.records_per_page - 1) / s.records_per_page;
}

absl::Status SessionManager::CheckBudget(const Session& s, uint32_t token_budget) const {
  const uint64_t max_tokens = std::min<uint64_t>(uint64_t{s.records_per_page} * s.pages_per_entry, INT32_MAX);
  if (token_budget == 0 || token_budget > max_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("token_budget must be 1..", max_tokens,
                     " (geometry.max_context_tokens or limits.max_tokens_per_request, in whole pages of ",
                     s.records_per_page, " records), got ", token_budget));
  }
  return absl::OkStatus();
}

// Admission: a request gets a free row of the session's arena and, for every layer, the pages
// that hold token_budget records. All or nothing. Order of checks: the session, draining,
// the request itself, the tenant's quotas, a free row, then the pool. With
// admission.on_pool_full = evict_lru_idle, a full pool evicts the same tenant's least recently
// admitted (or extended) request — its session is told first, outside the lock — and retries.
absl::StatusOr<v1::AdmitResponse> SessionManager::Admit(const v1::AdmitRequest& req) {
  const FlushJournalOnReturn flush{this};       // a durable request's change is journaled before the answer
  const NotifyDeparturesOnReturn notify{this};  // an allocation may retire another session's idle slab
  if (req.begin_import()) {
    if (req.lease_seconds() != 0) {  // before any import check: bad input, whatever the target
      absl::MutexLock lock(&mu_);
      return durable_.CheckLease(req.lease_seconds(), /*importing=*/true);  // session_durable.cc
    }
    return AdmitImport(req);  // session_import.cc
  }
  constexpr int kMaxEvictionsPerAdmit = 64;
  for (int evictions = 0;; ++evictions) {
    Victim victim;
    {
      absl::MutexLock lock(&mu_);
      AdmitOutcome outcome = AdmitLocked(req);
      if (outcome.result.ok() || !outcome.lacked_room || !options_.evict_on_pool_full ||
          evictions == kMaxEvictionsPerAdmit) {
        return std::move(outcome.result);
      }
      // Only when evicting can make this admission succeed: else it fails with nothing evicted.
      auto it = sessions_.find(req.session().session_id());
      if (evictions == 0 &&
          (it == sessions_.end() || !EvictionCouldAdmitLocked(*it->second, PagesFor(*it->second, req.token_budget()) *
                                                                               it->second->geometry.num_layers()))) {
        return std::move(outcome.result);
      }
      auto found = PickVictimLocked(req.session().session_id());
      if (!found.has_value()) return std::move(outcome.result);
      // A shared prefix's parent is never evicted for its child: the admission fails instead.
      if (req.parent_request_id() != 0 && found->session_id == req.session().session_id() &&
          found->request_id == req.parent_request_id()) {
        return std::move(outcome.result);
      }
      victim = *found;
    }
    (void)EvictVictim(victim, "evicted to admit another request of the same tenant (host pool full)");
  }
}

SessionManager::AdmitOutcome SessionManager::AdmitLocked(const v1::AdmitRequest& req) {
  absl::StatusOr<Session*> found = FindLocked(req.session());
  if (!found.ok()) return {found.status()};
  Session* s = *found;
  if (draining_)
    return {
        Reject(RejectReason::kDraining, absl::FailedPreconditionError("the daemon is draining: no new admissions"))};
  if (req.request_id() == 0) return {absl::InvalidArgumentError("request_id must be non-zero")};
  if (absl::Status budget = CheckBudget(*s, req.token_budget()); !budget.ok()) return {budget};
  if (req.context_tokens() > req.token_budget()) {
    return {absl::InvalidArgumentError(
        absl::StrCat("context_tokens (", req.context_tokens(), ") exceeds token_budget (", req.token_budget(), ")"))};
  }
  if (req.group()) {
    if (req.lease_seconds() != 0) {
      return {absl::InvalidArgumentError(
          "lease_seconds with group: a TP-group request is never durable (its pages are the group's, which no "
          "adopter could take over)")};
    }
    return AdmitGroupLocked(*s, req);  // session_groups.cc
  }
  if (s->requests.contains(req.request_id())) {
    return {
        absl::AlreadyExistsError(absl::StrCat("request ", req.request_id(), " is already admitted in this session"))};
  }
  if (absl::Status lease = durable_.CheckLease(req.lease_seconds(), req.begin_import()); !lease.ok()) return {lease};
  if (req.parent_request_id() != 0 || req.prefix_tokens() != 0) return AdmitSharedLocked(*s, req);
  // Charged in whole pages. Reserve (the quota, a row, the pages), then commit.
  const uint64_t per_layer = PagesFor(*s, req.token_budget());
  const uint64_t total = per_layer * s->geometry.num_layers();
  ReserveOutcome reserved = Reserve(ledger_, pages_, ReserveSpec{s->id, {s->id}, s->id, total});
  if (!reserved.reservation.has_value()) return RefusedLocked(std::move(reserved));
  const std::vector<PagePool::Page> pages = reserved.reservation->TakePages();
  Request r;
  r.id = req.request_id();
  r.admitted_at = absl::Now();
  r.capacity_tokens = req.token_budget();
  r.charged_pages = total;
  r.lease_end = DurableRequests::LeaseEnd(Now(), req.lease_seconds());
  // One allocation for every layer, split in layer order: a fresh slab gives each layer
  // consecutive pages.
  for (uint32_t layer = 0; layer < s->geometry.num_layers(); ++layer) {
    r.pages.emplace_back(pages.begin() + layer * per_layer, pages.begin() + (layer + 1) * per_layer);
  }
  const Request& added = s->requests.Admit(std::move(r), reserved.reservation->rows()[0]);
  JournalTouchLocked(*s, added);
  ++admissions_;
  return {AdmitAnswerLocked(*s, added)};
}

v1::AdmitResponse SessionManager::AdmitAnswerLocked(const Session& s, const Request& r) const {
  v1::AdmitResponse resp;
  resp.set_row(r.row());
  resp.set_capacity_tokens(r.capacity_tokens);
  FillLayers(s, r, resp.mutable_layers());
  return resp;
}

absl::Status SessionManager::CheckOwner(const v1::SessionRef& ref, uint32_t uid) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(ref.session_id());
  if (it == sessions_.end() || !TokenEquals(it->second->token, ref.token())) {
    return absl::PermissionDeniedError(
        absl::StrCat("session ", ref.session_id(), " is not a live session of this caller"));
  }
  if (it->second->tenant_uid != uid) {
    return absl::PermissionDeniedError(absl::StrCat("session ", ref.session_id(), " belongs to uid ",
                                                    it->second->tenant_uid, ", not to the caller's uid ", uid));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> SessionManager::EvictVictim(const Victim& v, const std::string& reason) {
  v1::SessionEvent event;
  event.mutable_evicted()->set_request_id(v.request_id);
  event.mutable_evicted()->set_reason(reason);
  // The notice is posted before the memory is released, outside the lock; posting never waits on
  // the stream (the service queues it), so an engine that does not read cannot stall this.
  const bool told = v.sink != nullptr && (*v.sink)(event);
  DeferredLog log;  // written once the lock is released
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(v.session_id);
  if (it == sessions_.end()) return absl::NotFoundError("the session ended while evicting");
  // The lock was dropped since the victim was chosen: only that very request may go. Its id may
  // name another one now (released and admitted again, perhaps as an import whose grant is open).
  Request* r = it->second->requests.Find(v.request_id);
  if (r == nullptr || r->generation != v.generation) {
    return absl::NotFoundError(
        absl::StrCat("request ", v.request_id, " was released while evicting (its id may name a newer request)"));
  }
  if (r->importing()) {
    return absl::FailedPreconditionError(absl::StrCat("request ", v.request_id, " is importing: it is not evicted"));
  }
  const uint64_t freed = (r->PageCount() - UnfreedPagesOfLocked(*it->second, *r)) * pool_->page_bytes();
  ReleaseRequestLocked(*it->second, *r);
  ++evictions_;
  if (!told) ++undelivered_notices_;
  DEFERRED_LOG(log, INFO) << "evicted request " << v.request_id << " of session " << v.session_id << " (" << freed
                          << " bytes; " << reason
                          << (told ? ")" : "; the notice was not delivered: its stream is gone or not read)");
  return freed;
}

// Extend appends pages to every layer (after the layer's last page where that page's slab has the
// next pages free) and never moves a record: the engine's tables keep every page they had. All or
// nothing: a full pool leaves the request exactly as it was.
absl::StatusOr<v1::ExtendResponse> SessionManager::Extend(const v1::ExtendRequest& req) {
  const FlushJournalOnReturn flush{this};       // a durable request's change is journaled before the answer
  const NotifyDeparturesOnReturn notify{this};  // declared before the lock: runs after it
  absl::MutexLock lock(&mu_);
  HS_ASSIGN_OR_RETURN(Session * s, FindLocked(req.session()));
  Request* found = s->requests.Find(req.request_id());
  if (found == nullptr)
    return absl::NotFoundError(absl::StrCat("request ", req.request_id(), " is not admitted in this session"));
  Request& r = *found;
  if (r.importing()) {
    return absl::FailedPreconditionError(
        absl::StrCat("request ", req.request_id(), " is importing: extend it after CommitImport"));
  }
  if (r.in_group) return ExtendGroupLocked(*s, r, req);  // session_groups.cc
  HS_RETURN_IF_ERROR(CheckBudget(*s, req.token_budget()));
  if (req.token_budget() <= r.capacity_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("token_budget (", req.token_budget(),
                                                   ") must exceed the current capacity (", r.capacity_tokens, ")"));
  }
  const uint64_t extra = PagesFor(*s, req.token_budget()) - r.pages[0].size();
  if (std::optional<Refusal> refusal = ledger_.CheckGrow(s->id, extra * r.pages.size(), 0)) {
    return Reject(*std::move(refusal));
  }
  ledger_.Touch(s->id, r.id);
  std::vector<std::vector<PagePool::Page>> added(r.pages.size());
  for (size_t layer = 0; extra != 0 && layer < r.pages.size(); ++layer) {
    absl::StatusOr<std::vector<PagePool::Page>> got = AllocatePagesLocked(s->id, extra, &r.pages[layer].back());
    if (!got.ok()) {
      for (const auto& done : added) (void)pool_->ReleaseAll(s->id, done);
      return got.status();
    }
    added[layer] = *std::move(got);
  }
  for (size_t layer = 0; layer < r.pages.size(); ++layer) {
    r.pages[layer].insert(r.pages[layer].end(), added[layer].begin(), added[layer].end());
  }
  r.capacity_tokens = req.token_budget();
  r.charged_pages += extra * r.pages.size();
  ledger_.SetPages(s->id, r.id, r.charged_pages);
  JournalTouchLocked(*s, r);
  v1::ExtendResponse resp;
  resp.set_capacity_tokens(r.capacity_tokens);
  resp.set_moved(false);
  FillLayers(*s, r, resp.mutable_layers());
  return resp;
}

absl::Status SessionManager::Release(const v1::ReleaseRequest& req) {
  const FlushJournalOnReturn flush{this};  // a durable request's change is journaled before the answer
  if (std::optional<absl::Status> aborted = ReleaseIfImporting(req)) return *aborted;  // session_import.cc
  absl::MutexLock lock(&mu_);
  HS_ASSIGN_OR_RETURN(Session * s, FindLocked(req.session()));
  Request* r = s->requests.Find(req.request_id());
  if (r == nullptr)
    return absl::NotFoundError(absl::StrCat("request ", req.request_id(), " is not admitted in this session"));
  ReleaseRequestLocked(*s, *r);
  return absl::OkStatus();
}

v1::StatsResponse SessionManager::Stats(std::optional<uint32_t> only_uid) const {
  v1::StatsResponse out;
  // Arenas' counters are read after the lock is dropped: a GPU arena's is a device copy, which may
  // wait on the GPU.
  std::vector<std::pair<int, std::shared_ptr<const Arena>>> counters;
  {
    absl::MutexLock lock(&mu_);
    out.set_version(options_.version);
    out.set_uptime_seconds(absl::ToDoubleSeconds(absl::Now() - start_time_));
    out.set_device(std::string(DeviceKindName(options_.device)));
    const PagePool::Stats ps = pool_->GetStats();
    v1::HostPoolStats* hp = out.mutable_host_pool();
    const uint64_t used = ps.pages_used * ps.page_bytes;
    hp->set_capacity_bytes(ps.budget_bytes);
    hp->set_used_bytes(used);
    hp->set_free_bytes(ps.budget_bytes - std::min(used, ps.budget_bytes));
    hp->set_fragmentation(used >= ps.budget_bytes ? 0.0
                                                  : static_cast<double>(ps.pages_free * ps.page_bytes) /
                                                        static_cast<double>(ps.budget_bytes - used));
    hp->set_largest_free_run_bytes(ps.ready_bytes + ps.unallocated_bytes);
    hp->set_hugepages(ps.hugepages);
    hp->set_locked(ps.locked);
    hp->set_page_bytes(ps.page_bytes);
    hp->set_slab_bytes(ps.slab_bytes);
    hp->set_pages_used(ps.pages_used);
    hp->set_pages_free(ps.pages_free);
    hp->set_pages_reserved(ps.pages_reserved);
    hp->set_pages_shared(ps.pages_shared);
    hp->set_shared_bytes(ps.pages_shared * ps.page_bytes);
    hp->set_slabs(ps.slabs);
    hp->set_ready_slabs(ps.ready_slabs);
    hp->set_scrub_queue(ps.scrub_queue);
    if (only_uid.has_value()) {
      const PagePool::Retired mine = pool_->RetiredOf(*only_uid);
      hp->set_retired_bytes(mine.bytes);
      hp->set_retired_slabs(mine.slabs);
    } else {
      hp->set_retired_bytes(ps.retired_bytes);
      hp->set_retired_slabs(ps.retired_slabs);
    }
    for (const auto& [owner, slabs] : pool_->SlabsByOwner()) {
      if (groups_.IsOwner(owner)) continue;  // in GroupStats.slabs
      if (!only_uid.has_value() || (sessions_.contains(owner) && sessions_.at(owner)->tenant_uid == *only_uid)) {
        (*hp->mutable_slabs_by_session())[owner] = slabs;
      }
    }
    uint32_t sessions = 0;
    out.set_admissions(admissions_);
    out.set_rejections(rejections_);
    out.set_draining(draining_);
    out.set_evictions(evictions_);
    out.set_undelivered_notices(undelivered_notices_);
    for (const auto& [reason, count] : rejections_by_reason_) {
      v1::RejectionCount* rc = out.add_rejections_by_reason();
      rc->set_reason(reason);
      rc->set_count(count);
    }
    for (const auto& [device, bytes] : arena_bytes_by_device_) (*out.mutable_arena_bytes_by_device())[device] = bytes;
    out.set_arena_budget_bytes(options_.arena_budget_bytes);
    uint32_t requests = 0;
    uint32_t parked = 0, importing = 0;
    for (const auto& [id, s] : sessions_) {
      if (only_uid.has_value() && s->tenant_uid != *only_uid) continue;
      ++sessions;
      requests += static_cast<uint32_t>(s->requests.size());
      v1::SessionStats* ss = out.add_session_stats();
      ss->set_session_id(id);
      ss->set_engine_name(s->engine_name);
      *ss->mutable_geometry() = s->geometry;
      ss->set_requests(static_cast<uint32_t>(s->requests.size()));
      parked += static_cast<uint32_t>(s->requests.Count(RequestState::kParked));
      importing += static_cast<uint32_t>(s->requests.Count(RequestState::kImporting));
      ss->set_host_bytes(ledger_.PagesOf(id) * ps.page_bytes);  // distinct pages: shared ones once
      ss->set_arena_bytes(s->arena_bytes);
      ss->set_peer_pid(s->peer_pid);
      v1::SetArenaKind(s->arena->kind(), ss);
      counters.emplace_back(out.session_stats_size() - 1, s->arena);
    }
    out.set_sessions(sessions);
    out.set_requests(requests);
    out.set_parked_requests(parked);
    out.set_importing_requests(importing);
    out.set_imports_committed(grants_.ended(ImportGrants::End::kCommitted));
    out.set_imports_aborted(grants_.ended(ImportGrants::End::kAborted));
    out.set_imports_expired(grants_.ended(ImportGrants::End::kExpired));
    OrphanStatsLocked(only_uid, &out);     // session_durable.cc
    FillGroupStatsLocked(only_uid, &out);  // session_groups.cc
  }
  if (options_.journal != nullptr) FillRestartStats(*options_.journal, out.mutable_restart());  // session_journal.cc
  // Without stopping the engine: the kernels' atomics land in device memory, and a copy of it
  // sees them as of some recent point, which is all stats need.
  for (const auto& [index, arena] : counters) {
    ArenaCounters c{};
    absl::Status st = arena->ReadCounters(&c);
    if (!st.ok()) {
      LOG(WARNING) << "reading a slot arena's counters: " << st;
      continue;
    }
    v1::SessionStats* ss = out.mutable_session_stats(index);
    ss->set_hits(c.hits);
    ss->set_misses(c.misses);
    ss->set_bytes_fetched(c.bytes_fetched);
    ss->set_rejected(c.rejected);
  }
  return out;
}

absl::StatusOr<UniqueFd> SessionManager::DupFdFor(uint64_t session_id, const std::string& token,
                                                  const std::string& object, const PeerCredentials& peer,
                                                  uint64_t* bytes, std::string* ipc_handle) {
  HS_ASSIGN_OR_RETURN(FdObject decoded, DecodeFdObject(object));
  return DupFdFor(session_id, token, decoded, peer, bytes, ipc_handle);
}

absl::StatusOr<UniqueFd> SessionManager::DupFdFor(uint64_t session_id, const std::string& token, const FdObject& object,
                                                  const PeerCredentials& peer, uint64_t* bytes,
                                                  std::string* ipc_handle) {
  if (bytes != nullptr) *bytes = 0;
  if (ipc_handle != nullptr) ipc_handle->clear();
  std::shared_ptr<const Arena> arena;
  {
    absl::MutexLock lock(&mu_);
    v1::SessionRef ref;
    ref.set_session_id(session_id);
    ref.set_token(token);
    HS_ASSIGN_OR_RETURN(Session * s, FindLocked(ref));
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
      absl::StatusOr<UniqueFd> fd = pool_->DupSlabFd(session_id, slab->n, bytes, s->tenant_uid);
      if (absl::IsPermissionDenied(fd.status()) && !s->group.empty()) return DupGroupSlabLocked(*s, slab->n, bytes);
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

void SessionManager::SetDraining(bool draining, std::function<void()> on_idle) {
  std::function<void()> run_now;
  {
    absl::MutexLock lock(&mu_);
    draining_ = draining;
    on_idle_ = std::move(on_idle);
    run_now = TakeIdleCallbackLocked();
  }
  if (run_now) run_now();
}

void SessionManager::SetEventSink(uint64_t session_id, EventSink sink) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it != sessions_.end()) it->second->sink = std::make_shared<EventSink>(std::move(sink));
}

void SessionManager::SetLimits(uint32_t max_sessions, uint32_t max_requests_per_session, const QuotaOptions& quotas,
                               bool evict_on_pool_full) {
  absl::MutexLock lock(&mu_);
  options_.max_sessions = max_sessions;
  options_.max_requests_per_session = max_requests_per_session;
  ledger_.SetQuotas(quotas);
  options_.evict_on_pool_full = evict_on_pool_full;
}

void SessionManager::SetHostArenaBudget(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  options_.host_arena_budget_bytes = bytes;
}

// Eviction by an operator: the session hears of it before its memory is released.
absl::StatusOr<v1::EvictResponse> SessionManager::Evict(const v1::EvictRequest& req, std::optional<uint32_t> only_uid) {
  const FlushJournalOnReturn flush{this};  // a durable request's change is journaled before the answer
  Victim v;
  DeferredLog log;  // written once the lock is released
  {
    absl::MutexLock lock(&mu_);
    if (durable_.contains(req.session_id())) return EvictOrphanLocked(req, only_uid, log);  // session_durable.cc
    auto it = sessions_.find(req.session_id());
    if (it != sessions_.end() && only_uid.has_value() && it->second->tenant_uid != *only_uid) {
      return absl::PermissionDeniedError(
          absl::StrCat("session ", req.session_id(), " belongs to another tenant; only an admin may evict from it"));
    }
    if (it == sessions_.end() || !it->second->requests.contains(req.request_id())) {
      return absl::NotFoundError(absl::StrCat("no request ", req.request_id(), " in session ", req.session_id()));
    }
    const Request& r = *it->second->requests.Find(req.request_id());
    if (r.importing()) {
      return absl::FailedPreconditionError(
          absl::StrCat("request ", req.request_id(), " is importing: abort its import (AbortImport) instead"));
    }
    v = Victim{req.session_id(), req.request_id(), r.generation, it->second->sink};
  }
  HS_ASSIGN_OR_RETURN(uint64_t freed, EvictVictim(v, req.reason().empty() ? "evicted by an operator" : req.reason()));
  v1::EvictResponse resp;
  resp.set_freed_bytes(freed);
  return resp;
}

absl::Status SessionManager::CheckInvariants() const {
  absl::MutexLock lock(&mu_);
  HS_RETURN_IF_ERROR(pool_->CheckInvariants());
  HS_RETURN_IF_ERROR(ledger_.CheckInvariants());
  absl::flat_hash_map<uint64_t, uint64_t> group_paid;  // session -> group pages it is charged for
  uint64_t live = 0;
  HS_RETURN_IF_ERROR(CheckGroupsLocked(&group_paid, &live));
  for (const auto& [id, s] : sessions_) {
    // States, rows and the ledger: exact by construction (request_table.h), checked all the same.
    HS_RETURN_IF_ERROR(s->requests.CheckInvariants());
    for (const auto& [rid, r] : s->requests) {
      if (r.pages.size() != s->geometry.num_layers()) {
        return absl::InternalError(absl::StrCat("session ", id, " request ", rid, ": pages for ", r.pages.size(),
                                                " layers, the geometry has ", s->geometry.num_layers()));
      }
      for (const auto& layer : r.pages) {
        if (layer.size() != PagesFor(*s, r.capacity_tokens)) {
          return absl::InternalError(absl::StrCat("session ", id, " request ", rid, ": a layer of ", layer.size(),
                                                  " pages for ", r.capacity_tokens, " tokens"));
        }
      }
    }
    // Distinct pages (a shared one once): the pool's count for the session and the ledger's, which
    // also charges the session the group pages it pays for.
    uint64_t pages = 0;
    HS_RETURN_IF_ERROR(CheckSharingLocked(*s, &pages));
    const uint64_t paid = group_paid.contains(id) ? group_paid.at(id) : 0;
    if (ledger_.PagesOf(id) != pages + paid || pool_->PagesOf(id) != pages) {
      return absl::InternalError(absl::StrCat("session ", id, ": requests hold ", pages, " pages (and ", paid,
                                              " group pages charged), the ledger counts ", ledger_.PagesOf(id),
                                              ", the pool ", pool_->PagesOf(id)));
    }
    live += pages;
  }
  HS_ASSIGN_OR_RETURN(const uint64_t orphaned, CheckOrphansLocked());  // session_durable.cc
  live += orphaned;
  const PagePool::Stats ps = pool_->GetStats();
  if (ps.pages_used != live || ledger_.used_pages() != live) {
    return absl::InternalError(absl::StrCat("pool uses ", ps.pages_used, " pages, the ledger ", ledger_.used_pages(),
                                            ", live requests ", live));
  }
  return absl::OkStatus();
}

void SessionManager::WaitPoolIdle() const { pool_unlocked_->WaitIdle(); }

absl::StatusOr<uint8_t*> SessionManager::RecordForTest(uint64_t session_id, uint64_t request_id, uint32_t layer,
                                                       uint32_t position) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return absl::NotFoundError("no such session");
  const Session& s = *it->second;
  const Request* r = s.requests.Find(request_id);
  if (r == nullptr || layer >= r->pages.size() || position >= r->capacity_tokens) {
    return absl::InvalidArgumentError("no such request, layer or position");
  }
  const PagePool::Page& page = r->pages[layer][position / s.records_per_page];
  return pool_->PageDataForTest(page) + uint64_t{position % s.records_per_page} * s.geometry.record_bytes();
}

}  // namespace hisparse
