#include "client_session.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <utility>
#include <variant>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "client_version.h"
#include "grpc_status.h"
#include "hisparse/common/mutex_mode.h"
#include "hisparse/common/socket_access.h"
#include "hisparse/common/status_macros.h"
#include "hisparse/common/unix_socket.h"

namespace hisparse {

namespace {

constexpr char kDefaultAddress[] = "unix:/run/hisparse/hisparsed.sock";

// The C ABI's arena kind, mapped from the wire's in this one place: a host arena served to the
// CUDA backend means it keeps a private GPU arena (device_backend.h, PrivateGpuArenaAllowed).
hs_arena_kind ToCArenaKind(v1::ArenaKind kind, hs_backend backend) {
  switch (kind) {
    case v1::ARENA_KIND_CUDA_VMM:
      return HS_ARENA_CUDA_VMM;
    case v1::ARENA_KIND_CUDA_IPC:
      return HS_ARENA_CUDA_IPC;
    default:
      return backend == HS_BACKEND_CUDA ? HS_ARENA_PRIVATE_GPU : HS_ARENA_HOST;
  }
}

// A failed exchange on the fd channel; a timeout reads as the daemon not answering.
absl::Status FdChannelError(const absl::Status& s, absl::string_view object) {
  if (absl::IsDeadlineExceeded(s)) {
    return absl::DeadlineExceededError(
        absl::StrCat("fetch \"", object, "\": the daemon's fd channel did not answer in time (", s.message(), ")"));
  }
  return absl::Status(s.code(), absl::StrCat("fetch \"", object, "\" over the fd channel: ", s.message()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ClientSession>> ClientSession::Open(const hs_session_options& o,
                                                                   const BackendWrap& wrap) {
  static const bool release_mutexes = (UseReleaseMutexMode(), true);  // mutex_mode.h: once, first
  (void)release_mutexes;
  std::unique_ptr<ClientSession> s(new ClientSession());
  HS_RETURN_IF_ERROR(s->Connect(o, wrap));
  return s;
}

namespace {

// The daemon's gRPC address: the option, else $HISPARSE_DAEMON, else the default socket.
std::string DaemonAddress(const hs_session_options& o) {
  std::string address = o.daemon_address ? o.daemon_address : "";
  if (address.empty()) {
    const char* env = std::getenv("HISPARSE_DAEMON");
    address = env && *env ? env : kDefaultAddress;
  }
  return address;
}

// A launch's HS_RESOLVE_LAUNCH_BESIDE / _PROGRAMMATIC bit as its order (the caller has refused both).
LaunchOrder OrderOf(uint32_t launch_flags) {
  if (launch_flags & HS_RESOLVE_LAUNCH_BESIDE) return LaunchOrder::kBeside;
  if (launch_flags & HS_RESOLVE_LAUNCH_PROGRAMMATIC) return LaunchOrder::kProgrammatic;
  return LaunchOrder::kAfterCompletion;
}

}  // namespace

// Open, step by step: the options, the channel, the session stream and its SessionOpened, the
// backend, the arena over the fd channel, the miss plans, the arena's attachment, the control lane. A failed step
// returns its error; what the earlier steps set up is released by the destructor (Open drops
// the half-open session).
absl::Status ClientSession::Connect(const hs_session_options& o, const BackendWrap& wrap, ClientSession* predecessor) {
  const auto t_start = std::chrono::steady_clock::now();
  const std::string address = DaemonAddress(o);
  HS_RETURN_IF_ERROR(UnixPathFromAddress(address).status());
  timeout_ms_ = o.timeout_ms ? o.timeout_ms : 10000;
  saved_ = Save(o, address, wrap);
  SetGeometry(o);
  SetGroup(o);  // client_groups.cc
  HS_RETURN_IF_ERROR(OpenStream(address));
  HS_RETURN_IF_ERROR(AwaitOpened(o.engine_name ? o.engine_name : ""));
  HS_RETURN_IF_ERROR(InitBackend(o, wrap, predecessor));
  HS_ASSIGN_OR_RETURN(Fetched arena, FetchArena());
  HS_RETURN_IF_ERROR(AllocMissPlans(predecessor));
  HS_RETURN_IF_ERROR(AttachArena(arena, predecessor));
  // Last, once the fd socket has answered the arena's fetch (a silent one fails the open there, in
  // one timeout): best effort, gRPC carries the lifecycle calls without it (client_lane.cc).
  OpenLane();
  open_phases_.total_s = SecondsSince(t_start);
  return absl::OkStatus();
}

ClientSession::SavedOptions ClientSession::Save(const hs_session_options& o, std::string address,
                                                const BackendWrap& wrap) {
  SavedOptions out;
  out.options = o;
  out.address = std::move(address);
  out.engine_name = o.engine_name ? o.engine_name : "";
  out.group = o.group ? o.group : "";
  if (o.layer_anchor != nullptr) out.layer_anchor.assign(o.layer_anchor, o.layer_anchor + o.num_layers);
  out.wrap = wrap;
  // The copy's pointers: into the strings above (a moved std::string may move its buffer, so
  // Recover points them again at the copy it opens with).
  out.options.daemon_address = nullptr;
  out.options.engine_name = nullptr;
  out.options.group = nullptr;
  out.options.layer_anchor = nullptr;
  return out;
}

void ClientSession::SetGeometry(const hs_session_options& o) {
  geometry_.set_gpu(o.gpu);
  // The CUDA backend names its GPU by UUID too: the daemon may number the node's GPUs otherwise
  // (an engine pod given one GPU calls it 0). Without it (no CUDA here), the ordinal alone.
  if (o.gpu >= 0 && (o.backend == HS_BACKEND_CUDA || o.backend == HS_BACKEND_AUTO)) {
    if (absl::StatusOr<std::string> uuid = CudaGpuUuid(o.gpu); uuid.ok()) geometry_.set_gpu_uuid(*uuid);
  }
  geometry_.set_num_layers(o.num_layers);
  geometry_.set_record_bytes(o.record_bytes);
  geometry_.set_k(o.k);
  geometry_.set_slots(o.slots);
  geometry_.set_max_requests(o.max_requests);
  geometry_.set_draft_tokens(o.draft_tokens);              // zero for callers built before ABI 1.4
  geometry_.set_max_context_tokens(o.max_context_tokens);  // zero (the daemon's limit) before ABI 1.6
  arena_geometry_ = ArenaGeometry{static_cast<int32_t>(o.max_requests),
                                  static_cast<int32_t>(o.num_layers),
                                  static_cast<int32_t>(o.slots),
                                  static_cast<int32_t>(o.k),
                                  o.record_bytes,
                                  static_cast<int32_t>(o.draft_tokens)};
  anchor_.resize(o.num_layers);
  for (uint32_t l = 0; l < o.num_layers; ++l) anchor_[l] = static_cast<int32_t>(l);
  if (o.layer_anchor != nullptr) {
    // Declared with the geometry; the daemon validates it (ValidateGeometry) before the session
    // opens, and anchor_ is used only after that.
    for (uint32_t l = 0; l < o.num_layers; ++l) {
      anchor_[l] = o.layer_anchor[l];
      geometry_.add_layer_anchor(o.layer_anchor[l]);
    }
  }
}

absl::Status ClientSession::OpenStream(const std::string& address) {
  // An AdmitBatch answer lists every page of up to 1024 requests, which on a large pool can pass
  // gRPC's default 4 MiB limit on what a client receives; the daemon is the only peer.
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  // The daemon is a local process that a restart brings back within milliseconds (and keeps its
  // durable requests): gRPC's default reconnect backoff (1 s first, shared by every channel to the
  // address through its global subchannel pool) would hold a new session off for a second.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 20);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 20);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // A socket this user may not open is said at once (gRPC would retry EACCES until the timeout).
  HS_RETURN_IF_ERROR(CheckSocketAccess(address));
  channel_ = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  if (!channel_->WaitForConnected(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms_))) {
    const std::string why = DescribeUnreachableSocket(address);
    return absl::UnavailableError(absl::StrCat("cannot reach hisparsed at ", address, why.empty() ? "" : ": ", why));
  }
  stub_ = v1::HiSparse::NewStub(channel_);
  return absl::OkStatus();
}

absl::Status ClientSession::AwaitOpened(const std::string& engine_name) {
  const auto t = std::chrono::steady_clock::now();
  stream_ = stub_->Session(&stream_context_);
  v1::SessionRequest open;
  *open.mutable_open()->mutable_geometry() = geometry_;
  open.mutable_open()->set_engine_name(engine_name);
  open.mutable_open()->set_client_version(ClientReportedVersion());
  if (group_.has_value()) *open.mutable_open()->mutable_group() = *group_;
  v1::SessionEvent first;
  // The stream has no deadline (it lives as long as the session), so the open handshake gets a
  // watchdog: a daemon that accepts but never answers cancels the stream instead of hanging us.
  absl::Notification answered;
  std::thread watchdog([this, &answered] {
    if (!answered.WaitForNotificationWithTimeout(absl::Milliseconds(timeout_ms_))) stream_context_.TryCancel();
  });
  const bool ok = stream_->Write(open) && stream_->Read(&first) && first.kind_case() == v1::SessionEvent::kOpened;
  answered.Notify();
  watchdog.join();
  if (!ok) {
    stream_->WritesDone();
    return FromGrpc(stream_->Finish(), "open session");
  }
  opened_ = first.opened();
  open_phases_.open_rpc_s = SecondsSince(t);
  open_phases_.daemon_create_s = opened_.arena().create_seconds();
  ref_.set_session_id(opened_.session_id());
  ref_.set_token(opened_.token());
  alive_ = true;
  watcher_ = std::thread([this] { WatchStream(); });
  return absl::OkStatus();
}

HostPageGeometry ClientSession::HostPages() const {
  return HostPageGeometry{opened_.records_per_page(), opened_.pages_per_entry()};
}

absl::Status ClientSession::InitBackend(const hs_session_options& o, const BackendWrap& wrap,
                                        ClientSession* predecessor) {
  const auto t = std::chrono::steady_clock::now();
  const HostPageGeometry pages = HostPages();
  if (predecessor != nullptr && predecessor->backend_ != nullptr) {
    const HostPageGeometry before = predecessor->HostPages();
    if (before.records_per_page == pages.records_per_page && before.pages_per_entry == pages.pages_per_entry) {
      // The same geometry (the options are the predecessor's) and page tables: its backend, whose
      // host map the ended session cleared (WatchStream), and whose buffers graphs may hold.
      backend_ = predecessor->backend_;
      owns_arena_ = false;  // the predecessor's until Recover hands it on (HandArenaTo)
      open_phases_.backend_init_s = SecondsSince(t);
      return absl::OkStatus();
    }
  }
  std::unique_ptr<DeviceBackend> made;
  if (o.backend == HS_BACKEND_CUDA || (o.backend == HS_BACKEND_AUTO && o.gpu >= 0)) {
    auto cuda = MakeCudaBackend(o.gpu, arena_geometry_, pages);
    if (!cuda.ok() && o.backend == HS_BACKEND_CUDA) return cuda.status();
    if (cuda.ok()) made = std::move(*cuda);
  }
  if (made == nullptr) made = MakeHostBackend(arena_geometry_, pages);
  if (wrap) made = wrap(std::move(made));
  backend_ = std::move(made);
  open_phases_.backend_init_s = SecondsSince(t);
  return absl::OkStatus();
}

absl::StatusOr<ClientSession::Fetched> ClientSession::FetchArena() {
  const auto t = std::chrono::steady_clock::now();
  HS_ASSIGN_OR_RETURN(Fetched arena, Fetch(FdArena{}));
  open_phases_.fetch_arena_s = SecondsSince(t);
  if (arena.bytes < ComputeArenaOffsets(arena_geometry_).total_bytes) {
    return absl::InternalError("the daemon's arena is smaller than the geometry needs");
  }
  return arena;
}

absl::Status ClientSession::AllocMissPlans(const ClientSession* predecessor) {
  // Kernel-visible memory, owned by the backend.
  const uint32_t layers = static_cast<uint32_t>(anchor_.size());
  plan_max_batch_.assign(layers, -1);  // no plan recorded yet (a predecessor's is stale)
  if (predecessor != nullptr && predecessor->backend_ == backend_) {
    plans_ = predecessor->plans_;  // the backend's memory, where graphs may read it
    return absl::OkStatus();
  }
  plans_.assign(layers, MissPlan{});
  for (uint32_t l = 0; l < layers; ++l) {
    const int32_t a = anchor_[l];
    if (a != static_cast<int32_t>(l) && plans_[a].summary == nullptr) {
      HS_ASSIGN_OR_RETURN(plans_[a], backend_->AllocMissPlan());
    }
  }
  return absl::OkStatus();
}

absl::Status ClientSession::AttachArena(const Fetched& arena, ClientSession* predecessor) {
  const v1::ArenaKind kind = arena_kind();
  const bool want_fd = kind != v1::ARENA_KIND_CUDA_IPC;
  if (want_fd != arena.fd.valid() || want_fd == !arena.ipc_handle.empty()) {
    return absl::InternalError(
        absl::StrCat("the fd channel sent the \"", v1::ArenaKindName(kind), "\" arena in the wrong form"));
  }
  const auto t = std::chrono::steady_clock::now();
  AttachedArena attached;
  attached.bytes = arena.bytes;
  switch (kind) {
    case v1::ARENA_KIND_HOST: {
      attached.form = AttachedArena::Form::kHostMapped;
      if (predecessor != nullptr && predecessor->backend_ == backend_ &&
          predecessor->arena_map_.size() == arena.bytes && predecessor->arena_map_.RemapShared(arena.fd.get()).ok()) {
        // At the predecessor's address (Recover): its mapping becomes ours when the recovery is done.
        arena_in_place_ = true;
        attached.mapped = predecessor->arena_map_.data();
        break;
      }
      HS_ASSIGN_OR_RETURN(arena_map_, MappedRegion::MapShared(arena.fd.get(), arena.bytes));
      attached.mapped = arena_map_.data();
      break;
    }
    case v1::ARENA_KIND_CUDA_VMM:
      // The daemon's GPU memory: imported and mapped by the backend, never mmap'ed here.
      attached.form = AttachedArena::Form::kCudaVmmFd;
      attached.fd = arena.fd.get();
      break;
    case v1::ARENA_KIND_CUDA_IPC:
      // The legacy fallback: a cudaIpc handle, opened (and closed at the end) by the backend.
      attached.form = AttachedArena::Form::kCudaIpcHandle;
      attached.handle = arena.ipc_handle;
      break;
    default:
      return absl::UnimplementedError(absl::StrCat("the daemon offers a slot arena of kind \"", opened_.arena().kind(),
                                                   "\" (", opened_.arena().kind_enum(),
                                                   "), which this client does not support"));
  }
  HS_ASSIGN_OR_RETURN(arena_, backend_->Attach(attached, arena_geometry_));
  open_phases_.attach_s = SecondsSince(t);
  backend_->LastImportTimes(&open_phases_.import_s, &open_phases_.map_s);
  return absl::OkStatus();
}

ClientSession::~ClientSession() {
  // This process lets go of the daemon's GPU arena first: the daemon frees it when the session ends.
  // A session that handed its arena on (Recover), or one Recover opened and lost, has none to let go.
  if (backend_ && owns_arena_) backend_->ReleaseArena();
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;  // the watcher's end leaves the rows alone: the arena is gone already
  }
  if (stream_ != nullptr) {
    // Ending the stream ends the session: the daemon releases everything it held but its durable
    // requests, which stay parked until their lease ends or a session adopts them.
    if (alive_) {
      v1::SessionRequest close;
      close.mutable_close();
      stream_->Write(close);
      stream_->WritesDone();
    }
    stream_context_.TryCancel();
    if (watcher_.joinable()) watcher_.join();
  }
  // Every slab unregisters and unmaps as it goes (Slab owns both); no other call runs now.
  absl::flat_hash_map<uint64_t, Slab> slabs;
  {
    absl::MutexLock lock(&mu_);
    slabs = std::move(slabs_);
    slabs_.clear();
  }
}

void ClientSession::WatchStream() {
  v1::SessionEvent event;
  while (stream_->Read(&event)) {
    if (event.kind_case() == v1::SessionEvent::kImportFinished) OnImportFinished(event.import_finished());
    if (event.kind_case() == v1::SessionEvent::kSlabRetired) {
      std::vector<Slab> retired;  // unregistered and unmapped after the lock
      absl::MutexLock lock(&mu_);
      OnSlabsRetiredLocked(event.slab_retired(), &retired);
      continue;
    }
    if (event.kind_case() != v1::SessionEvent::kEvicted) continue;
    // The daemon releases the request's memory right after this notice: forget its rows and
    // mappings now, and let the engine learn of it (hs_poll_evicted).
    const uint64_t id = event.evicted().request_id();
    std::vector<Slab> retired;  // released after the lock
    absl::MutexLock lock(&mu_);
    auto it = requests_.find(id);
    if (it != requests_.end()) {
      if (!it->second.parked) (void)PublishRow(it->second.row, nullptr);  // a parked one's row is another's
      DropSlabs(it->second, &retired);
      requests_.erase(it);
    }
    evicted_.push_back(id);
  }
  absl::MutexLock lock(&mu_);  // AwaitImport waits on mu_ for alive_ too
  // Whatever ended the stream, what the daemon now holds for these rows is unknown (a restarted
  // daemon may have kept a durable request, never a plain one): no row is served until Recover.
  // Unpublished before the session reads as ended, so that Recover (which waits for that) and the
  // session it opens on the same backend never race this thread for the host map.
  if (!closing_) UnpublishAllLocked();
  alive_ = false;  // the data path refuses from here on
}

void ClientSession::UnpublishAllLocked() {
  for (const auto& [id, r] : requests_) {
    if (!r.parked) (void)PublishRow(r.row, nullptr);  // a failure leaves the row as the kernel's check finds it
  }
}

void ClientSession::ReturnEvicted(std::vector<uint64_t> ids) {
  if (ids.empty()) return;
  absl::MutexLock lock(&mu_);
  ids.insert(ids.end(), evicted_.begin(), evicted_.end());
  evicted_ = std::move(ids);
}

std::vector<uint64_t> ClientSession::TakeEvicted() {
  absl::MutexLock lock(&mu_);
  return std::exchange(evicted_, {});
}

std::unique_ptr<grpc::ClientContext> ClientSession::CallContext() const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms_));
  return ctx;
}

absl::Status ClientSession::CheckAlive() const {
  if (!alive_) {
    return absl::UnavailableError(
        "the session ended: the daemon stopped, restarted or closed it; recover it (hs_session_recover) or open a new "
        "session");
  }
  return absl::OkStatus();
}

absl::StatusOr<ClientSession::Fetched> ClientSession::Fetch(const FdObject& what) {
  const std::string object = FdObjectName(what);
  absl::MutexLock lock(&fd_mu_);
  // Every step is bounded by timeout_ms: a daemon that does not accept, or accepts and never
  // answers, fails the call instead of hanging it.
  if (!fd_channel_.valid()) {
    auto conn = ConnectUnixSeqpacket(opened_.fd_socket(), static_cast<int>(std::min<uint32_t>(timeout_ms_, INT32_MAX)));
    if (!conn.ok()) return FdChannelError(conn.status(), object);
    fd_channel_ = std::move(*conn);
  }
  const FdRequest request{FdVersion::kV2, opened_.session_id(), opened_.token(), what};
  const absl::Status sent = SendPacket(fd_channel_.get(), EncodeFdRequest(request), -1);
  auto reply = sent.ok() ? RecvPacket(fd_channel_.get(), 1024) : absl::StatusOr<Packet>(sent);
  if (!reply.ok()) {
    fd_channel_.Reset();  // a late reply must never be read as the answer to the next request
    return FdChannelError(reply.status(), object);
  }
  absl::StatusOr<FdReply> decoded = DecodeFdReply(reply->payload, reply->fd.valid());
  if (!decoded.ok()) {
    return absl::InternalError(
        absl::StrCat("fd channel refused \"", object, "\": ", reply->payload, " (", decoded.status().message(), ")"));
  }
  if (const auto* err = std::get_if<FdErr>(&*decoded)) {
    // The daemon's code is kept (a quota or connection cap is RESOURCE_EXHAUSTED).
    return absl::Status(err->code, absl::StrCat("fd channel refused \"", object, "\": ", reply->payload));
  }
  FdOk& ok = std::get<FdOk>(*decoded);
  Fetched out;
  out.bytes = ok.bytes;
  out.ipc_handle = std::move(ok.handle);
  out.fd = std::move(reply->fd);
  return out;
}

absl::StatusOr<UniqueFd> ClientSession::FetchFd(const FdObject& object, uint64_t* bytes) {
  HS_ASSIGN_OR_RETURN(Fetched f, Fetch(object));
  if (!f.fd.valid()) {
    return absl::InternalError(absl::StrCat("the fd channel sent no descriptor for \"", FdObjectName(object), "\""));
  }
  *bytes = f.bytes;
  return std::move(f.fd);
}

std::vector<const uint8_t*> ClientSession::PageTable(const Request& r) const {
  std::vector<const uint8_t*> pages;
  pages.reserve(r.layers.size() * (r.layers.empty() ? 0 : r.layers[0].size()));
  for (const auto& layer : r.layers) {
    for (const v1::PageRef& p : layer) {
      const uint8_t* addr = slabs_.at(p.slab()).kernel_addr + p.offset();
      pages.push_back(p.read_only() ? addr + 1 : addr);  // pages are aligned: + 1 sets bit 0
    }
  }
  return pages;
}

absl::Status ClientSession::PublishRow(uint32_t row, const Request* r) {
  if (r == nullptr) return backend_->SetHostMapRow(static_cast<int32_t>(row), nullptr, 0, 0);
  // The request's page tables, layer-major (pages[l * n + i], bit 0 = read-only), as the kernels
  // read them (arena_layout.h, "Host page tables").
  const std::vector<const uint8_t*> pages = PageTable(*r);
  const uint32_t n = r->layers.empty() ? 0 : static_cast<uint32_t>(r->layers[0].size());
  return backend_->SetHostMapRow(static_cast<int32_t>(row), pages.data(), n, static_cast<int32_t>(r->capacity));
}

absl::StatusOr<ClientSession::Request> ClientSession::InstallRequest(
    uint32_t row, uint32_t capacity, const google::protobuf::RepeatedPtrField<v1::LayerPages>& layers,
    const SlabErrors& errors) {
  Request r;
  r.row = row;
  r.capacity = capacity;
  const uint64_t per_page = opened_.records_per_page();
  const uint64_t want = per_page == 0 ? 0 : (uint64_t{capacity} + per_page - 1) / per_page;
  if (static_cast<uint32_t>(layers.size()) != geometry_.num_layers() || row >= geometry_.max_requests() || want == 0 ||
      want > opened_.pages_per_entry()) {
    return absl::InternalError("the daemon's answer does not match the session geometry");
  }
  for (int l = 0; l < layers.size(); ++l) {
    if (layers[l].layer() != static_cast<uint32_t>(l) || static_cast<uint64_t>(layers[l].pages_size()) != want) {
      return absl::InternalError(absl::StrCat("the daemon's answer lists ", layers[l].pages_size(), " pages for layer ",
                                              layers[l].layer(), "; ", capacity, " tokens need ", want));
    }
    r.layers.emplace_back(layers[l].pages().begin(), layers[l].pages().end());
  }
  HS_RETURN_IF_ERROR(AcquireSlabs(r, errors));
  return r;
}

absl::StatusOr<hs_request_info> ClientSession::Extend(uint64_t request_id, uint32_t token_budget) {
  HS_RETURN_IF_ERROR(CheckAlive());
  v1::ExtendRequest req;
  *req.mutable_session() = ref_;
  req.set_request_id(request_id);
  req.set_token_budget(token_budget);
  v1::ExtendResponse resp;
  HS_RETURN_IF_ERROR(Call(LaneVerb::kExtend, &v1::HiSparse::Stub::Extend, req, &resp, "extend"));
  absl::StatusOr<hs_request_info> out = absl::InternalError("extend: not installed");
  std::vector<Slab> retired;  // released after the lock
  WithSlabsLocked(SlabsOf(resp.layers()), [&](const SlabErrors& errors) {
    mu_.AssertHeld();
    out = ExtendLocked(request_id, resp, errors, &retired);
  });
  return out;
}

absl::StatusOr<hs_request_info> ClientSession::ExtendLocked(uint64_t request_id, const v1::ExtendResponse& resp,
                                                            const SlabErrors& errors, std::vector<Slab>* retired) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return absl::InternalError("extended a request this client does not know");
  // Count the pages again before dropping the old count, so a slab holding old and new pages stays
  // mapped. Extend never moves a record: the old pages lead every layer's list unchanged.
  auto r = InstallRequest(it->second.row, resp.capacity_tokens(), resp.layers(), errors);
  if (!r.ok()) return r.status();
  DropSlabs(it->second, retired);
  r->parked = it->second.parked;
  it->second = std::move(*r);
  if (!it->second.parked) HS_RETURN_IF_ERROR(PublishRow(it->second.row, &it->second));
  hs_request_info info = HS_REQUEST_INFO_INIT;
  info.row = it->second.row;
  info.capacity_tokens = it->second.capacity;
  info.moved = resp.moved() ? 1 : 0;
  return info;
}

absl::Status ClientSession::Release(uint64_t request_id) {
  HS_RETURN_IF_ERROR(CheckAlive());
  v1::ReleaseRequest req;
  *req.mutable_session() = ref_;
  req.set_request_id(request_id);
  v1::ReleaseResponse resp;
  HS_RETURN_IF_ERROR(Call(LaneVerb::kRelease, &v1::HiSparse::Stub::Release, req, &resp, "release"));
  std::vector<Slab> retired;  // released after the lock
  absl::MutexLock lock(&mu_);
  imports_.erase(request_id);  // releasing an importing request aborts the import
  return UninstallLocked(request_id, &retired);
}

absl::StatusOr<uint8_t*> ClientSession::RecordPtr(uint64_t request_id, uint32_t layer, uint32_t position) {
  HS_RETURN_IF_ERROR(CheckAlive());  // an ended session's mappings may be its successor's (Recover)
  absl::MutexLock lock(&mu_);
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return absl::NotFoundError(absl::StrCat("request ", request_id, " is not admitted here"));
  const Request& r = it->second;
  if (layer >= r.layers.size()) return absl::InvalidArgumentError(absl::StrCat("layer ", layer, " out of range"));
  if (position >= r.capacity) {
    return absl::InvalidArgumentError(
        absl::StrCat("position ", position, " beyond the request's capacity ", r.capacity));
  }
  // The record of position p: page p / R of the layer, at (p % R) * record_bytes.
  const uint32_t per_page = opened_.records_per_page();
  const v1::PageRef& page = r.layers[layer][position / per_page];
  return slabs_.at(page.slab()).map.data() + page.offset() + uint64_t{position % per_page} * geometry_.record_bytes();
}

absl::StatusOr<v1::StatsResponse> ClientSession::NodeStats() {
  v1::StatsResponse resp;
  HS_RETURN_IF_ERROR(FromGrpc(stub_->Stats(CallContext().get(), v1::StatsRequest(), &resp), "stats"));
  return resp;
}

hs_session_timings ClientSession::Timings() const {
  hs_session_timings t = HS_SESSION_TIMINGS_INIT;
  const OpenPhases& o = open_phases_;
  t.open_rpc_s = o.open_rpc_s;
  t.daemon_create_s = o.daemon_create_s;
  t.backend_init_s = o.backend_init_s;
  t.fetch_arena_s = o.fetch_arena_s;
  t.import_s = o.import_s;
  t.map_s = o.map_s;
  t.attach_s = o.attach_s;
  t.open_total_s = o.total_s;
  const HostMapPhases h = host_map_phases();
  t.slabs_mapped = h.slabs;
  t.slab_bytes_mapped = h.bytes;
  t.slab_fetch_s = h.fetch_s;
  t.slab_mmap_s = h.mmap_s;
  t.slab_register_s = h.register_s;
  return t;
}

hs_session_info ClientSession::Info() const {
  hs_session_info info = HS_SESSION_INFO_INIT;
  info.session_id = opened_.session_id();
  info.backend = backend_->kind();
  info.slot_base = arena_.records;
  info.draft_tokens = geometry_.draft_tokens();
  info.record_stride = arena_.RecordStride();
  info.slots = geometry_.slots();
  info.max_tokens_per_request = opened_.max_tokens_per_request();
  info.arena_bytes = opened_.arena().bytes();
  info.arena_kind = ToCArenaKind(arena_kind(), backend_->kind());
  info.control_lane = on_lane_.load() ? 1 : 0;
  return info;
}

absl::Status ClientSession::Resolve(const hs_resolve_args& a) {
  HS_RETURN_IF_ERROR(CheckAlive());  // a row's state is unknown once the session ended
  if (a.layer >= geometry_.num_layers())
    return absl::InvalidArgumentError(absl::StrCat("layer ", a.layer, " out of range"));
  if (a.max_batch < 0 || a.rows == nullptr || a.seq_lens == nullptr || a.positions == nullptr ||
      (a.out_slots == nullptr && a.page_table == nullptr)) {
    return absl::InvalidArgumentError(
        "resolve needs max_batch >= 0 and rows, seq_lens, positions, and out_slots or page_table");
  }
  if (a.page_table != nullptr) {
    if (const char* why = ValidatePageTable(arena_geometry_, a.page_records, a.page_offset)) {
      return absl::InvalidArgumentError(absl::StrCat("resolve page table: ", why, " (page_records ", a.page_records,
                                                     ", page_offset ", a.page_offset, ")"));
    }
  }
  constexpr uint32_t kOrderFlags = HS_RESOLVE_LAUNCH_PROGRAMMATIC | HS_RESOLVE_LAUNCH_BESIDE;
  constexpr uint32_t kKnownFlags = kOrderFlags | HS_RESOLVE_LAUNCH_EARLY_DEPENDENTS;
  if ((a.launch_flags & ~kKnownFlags) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("resolve launch_flags 0x", absl::Hex(a.launch_flags),
                     ": unknown bits (known: HS_RESOLVE_LAUNCH_PROGRAMMATIC, HS_RESOLVE_LAUNCH_BESIDE, "
                     "HS_RESOLVE_LAUNCH_EARLY_DEPENDENTS)"));
  }
  if ((a.launch_flags & kOrderFlags) == kOrderFlags) {
    return absl::InvalidArgumentError(
        "resolve launch_flags: HS_RESOLVE_LAUNCH_PROGRAMMATIC and HS_RESOLVE_LAUNCH_BESIDE exclude each other");
  }
  if (a.max_blocks < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("resolve max_blocks ", a.max_blocks, ": must be >= 0 (0: no budget)"));
  }
  if (a.consumer_warps < 0 || a.consumer_warps > kMaxConsumerWarps) {
    return absl::InvalidArgumentError(absl::StrCat("resolve consumer_warps ", a.consumer_warps, ": must be in [0, ",
                                                   kMaxConsumerWarps, "] (0: the library's choice)"));
  }
  ResolvePlacement placement;
  placement.order = OrderOf(a.launch_flags);
  placement.max_blocks = a.max_blocks;          // zero for callers built before ABI 1.13
  placement.consumer_warps = a.consumer_warps;  // zero for callers built before ABI 1.15
  placement.early_dependents = (a.launch_flags & HS_RESOLVE_LAUNCH_EARLY_DEPENDENTS) != 0;
  ResolveDesc d{};
  d.arena = arena_;
  d.layer = static_cast<int32_t>(a.layer);
  d.max_batch = a.max_batch;
  d.batch_size = a.batch_size;  // null: the backend supplies max_batch in its own memory space
  d.rows = a.rows;
  d.seq_lens = a.seq_lens;
  d.positions = a.positions;
  d.out_slots = a.out_slots;
  d.page_table = a.page_table;
  d.page_records = a.page_records;
  d.page_offset = a.page_offset;
  d.query_counts = a.query_counts;  // zero (NULL) for callers built before ABI 1.4
  d.error_flags = backend_->error_flags();
  const MissPlan& plan = plans_[a.layer];
  if (plan.summary != nullptr) {
    if (a.max_batch > plan.max_batch) {
      return absl::InvalidArgumentError(absl::StrCat("resolve of anchor layer ", a.layer, ": max_batch ", a.max_batch,
                                                     " exceeds the session's rows (", plan.max_batch,
                                                     "), which its miss plan is sized for"));
    }
    d.plan = plan;
  }
  absl::ReaderMutexLock lock(&mu_);  // the host map must not change under a host-backend step
  d.host = backend_->host_map();
  HS_RETURN_IF_ERROR(backend_->Resolve(d, placement, a.stream));
  if (plan.summary != nullptr) plan_max_batch_[a.layer] = a.max_batch;
  return absl::OkStatus();
}

absl::Status ClientSession::Prefetch(uint32_t layer, void* stream) {
  HS_RETURN_IF_ERROR(CheckAlive());
  if (layer >= geometry_.num_layers())
    return absl::InvalidArgumentError(absl::StrCat("prefetch: layer ", layer, " out of range"));
  const int32_t a = anchor_[layer];
  if (a == static_cast<int32_t>(layer)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "prefetch: layer ", layer, " selects on its own (declare its anchor in layer_anchor at session open)"));
  }
  if (plan_max_batch_[a] < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("prefetch: anchor layer ", a, " of layer ", layer, " has not been resolved yet"));
  }
  ReplayDesc d{};
  d.arena = arena_;
  d.anchor_layer = a;
  d.layer = static_cast<int32_t>(layer);
  d.max_batch = plan_max_batch_[a];
  d.plan = plans_[a];
  // Tuning knob for benchmarks: thread blocks the copies take (default: an eighth of the SMs).
  static const int32_t blocks = [] {
    const char* env = std::getenv("HISPARSE_PREFETCH_BLOCKS");
    return env ? std::max(0, std::atoi(env)) : 0;
  }();
  d.blocks = blocks;
  absl::ReaderMutexLock lock(&mu_);
  d.host = backend_->host_map();
  return backend_->Replay(d, stream);
}

absl::Status ClientSession::Prewarm(const hs_prewarm_args& a) {
  HS_RETURN_IF_ERROR(CheckAlive());
  // The session's own bounds; CheckPrewarmDesc checks the rest below.
  if (a.layer >= geometry_.num_layers() || a.max_batch > arena_geometry_.max_rows) {
    return absl::InvalidArgumentError(absl::StrCat("prewarm: layer ", a.layer, " of ", geometry_.num_layers(),
                                                   ", max_batch ", a.max_batch, " of the session's ",
                                                   arena_geometry_.max_rows, " rows"));
  }
  PrewarmDesc d;
  d.geometry = arena_geometry_;
  d.layer = static_cast<int32_t>(a.layer);
  d.max_batch = a.max_batch;
  d.batch_size = a.batch_size;  // null: the backend supplies max_batch in its own memory space
  d.rows = a.rows;
  d.seq_lens = a.seq_lens;
  d.max_positions = static_cast<int32_t>(std::max<uint32_t>(1, opened_.max_tokens_per_request()));
  d.granule_bytes = a.granule_bytes == 0 ? kPrewarmDefaultGranule : a.granule_bytes;
  d.max_blocks = a.max_blocks;
  d.granule_stride = a.granule_stride == 0 ? 1 : a.granule_stride;
  d.granule_phase = a.granule_phase;
  constexpr uint32_t kOrderFlags = HS_RESOLVE_LAUNCH_PROGRAMMATIC | HS_RESOLVE_LAUNCH_BESIDE;
  if ((a.launch_flags & ~kOrderFlags) != 0 || a.launch_flags == kOrderFlags) {
    return absl::InvalidArgumentError(absl::StrCat("prewarm launch_flags 0x", absl::Hex(a.launch_flags),
                                                   ": 0, HS_RESOLVE_LAUNCH_PROGRAMMATIC or HS_RESOLVE_LAUNCH_BESIDE"));
  }
  d.order = OrderOf(a.launch_flags);
  d.error_flags = backend_->error_flags();
  absl::ReaderMutexLock lock(&mu_);  // the host map must not change under a host-backend read
  d.host = backend_->host_map();
  PrewarmDesc checked = d;  // the backend supplies a null batch_size
  if (checked.batch_size == nullptr) checked.batch_size = &a.max_batch;
  if (const char* why = CheckPrewarmDesc(checked)) return absl::InvalidArgumentError(absl::StrCat("prewarm: ", why));
  return backend_->Prewarm(d, a.stream);
}

absl::Status ClientSession::Store(uint64_t request_id, int32_t start_pos, int32_t num_tokens, int32_t seq_len_after,
                                  const void* src, int64_t layer_stride, int64_t token_stride, void* stream) {
  HS_RETURN_IF_ERROR(CheckAlive());
  absl::ReaderMutexLock lock(&mu_);
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return absl::NotFoundError(absl::StrCat("request ", request_id, " is not admitted here"));
  if (it->second.parked) {
    return absl::FailedPreconditionError(absl::StrCat("store: request ", request_id, " is parked (resume it first)"));
  }
  if (src == nullptr || num_tokens < 0 || start_pos < 0 ||
      token_stride < static_cast<int64_t>(geometry_.record_bytes()) ||
      static_cast<int64_t>(start_pos) + num_tokens > it->second.capacity || seq_len_after < start_pos + num_tokens ||
      seq_len_after > static_cast<int64_t>(it->second.capacity)) {
    return absl::InvalidArgumentError(absl::StrCat("store: tokens [", start_pos, ", ", start_pos + num_tokens,
                                                   "), seq_len_after ", seq_len_after, " and token stride ",
                                                   token_stride, " must fit the request's capacity ",
                                                   it->second.capacity, " and record size ", geometry_.record_bytes()));
  }
  StoreDesc d{};
  d.arena = arena_;
  d.host = backend_->host_map();
  d.row = static_cast<int32_t>(it->second.row);
  d.start_pos = start_pos;
  d.num_tokens = num_tokens;
  d.seq_len_after = seq_len_after;
  d.src = static_cast<const uint8_t*>(src);
  d.src_layer_stride = layer_stride;
  d.src_token_stride = token_stride;
  return backend_->Store(d, stream);
}

absl::Status ClientSession::StoreIndexed(const hs_store_indexed_args& a) {
  HS_RETURN_IF_ERROR(CheckAlive());
  absl::ReaderMutexLock lock(&mu_);
  auto it = requests_.find(a.request_id);
  if (it == requests_.end()) {
    return absl::NotFoundError(absl::StrCat("indexed store: request ", a.request_id, " is not admitted here"));
  }
  if (it->second.parked) {
    return absl::FailedPreconditionError(
        absl::StrCat("indexed store: request ", a.request_id, " is parked (resume it first)"));
  }
  const uint64_t layers = geometry_.num_layers();
  if (a.num_layers < 1 || static_cast<uint64_t>(a.first_layer) + a.num_layers > layers) {
    return absl::InvalidArgumentError(absl::StrCat("indexed store: layers [", a.first_layer, ", ",
                                                   static_cast<uint64_t>(a.first_layer) + a.num_layers,
                                                   ") must be a non-empty range inside [0, ", layers, ")"));
  }
  const int64_t capacity = it->second.capacity;
  const int64_t end = static_cast<int64_t>(a.start_pos) + a.num_tokens;
  if (a.start_pos < 0 || a.num_tokens < 0 || end > capacity || a.seq_len_after < 1 || a.seq_len_after < end ||
      a.seq_len_after > capacity) {
    return absl::InvalidArgumentError(
        absl::StrCat("indexed store: tokens [", a.start_pos, ", ", end, ") and seq_len_after ", a.seq_len_after,
                     " must lie in the request's capacity ", capacity, " with the tokens at or before seq_len_after"));
  }
  if (a.num_tokens > 0 && (a.src_base == nullptr || a.src_index == nullptr || a.src_tokens < 1 ||
                           a.src_token_stride < static_cast<int64_t>(geometry_.record_bytes()))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "indexed store: src_base and src_index must be set, src_tokens >= 1 and src_token_stride >= record_bytes (",
        geometry_.record_bytes(), "); got src_tokens ", a.src_tokens, ", src_token_stride ", a.src_token_stride));
  }
  IndexedStoreDesc d{};
  d.arena = arena_;
  d.host = backend_->host_map();
  d.row = static_cast<int32_t>(it->second.row);
  d.first_layer = static_cast<int32_t>(a.first_layer);
  d.num_layers = static_cast<int32_t>(a.num_layers);
  d.start_pos = a.start_pos;
  d.num_tokens = a.num_tokens;
  d.seq_len_after = a.seq_len_after;
  d.src_base = static_cast<const uint8_t*>(a.src_base);
  d.src_index = a.src_index;
  d.src_tokens = a.src_tokens;
  d.src_layer_stride = a.src_layer_stride;
  d.src_token_stride = a.src_token_stride;
  return backend_->StoreIndexed(d, a.stream);
}

absl::Status ClientSession::Append(uint32_t layer, int32_t max_batch, const int32_t* batch_size, const int32_t* rows,
                                   const int32_t* seq_lens, const int32_t* token_counts, const void* src,
                                   int64_t src_stride, void* stream) {
  HS_RETURN_IF_ERROR(CheckAlive());
  if (layer >= geometry_.num_layers() || max_batch < 0 || rows == nullptr || seq_lens == nullptr || src == nullptr ||
      src_stride < static_cast<int64_t>(geometry_.record_bytes())) {
    return absl::InvalidArgumentError(
        "append needs a layer in range, rows, seq_lens, src and src_stride >= record_bytes");
  }
  AppendDesc d{};
  d.arena = arena_;
  d.layer = static_cast<int32_t>(layer);
  d.max_batch = max_batch;
  d.batch_size = batch_size;
  d.rows = rows;
  d.seq_lens = seq_lens;
  d.src = static_cast<const uint8_t*>(src);
  d.src_stride = src_stride;
  d.token_counts = token_counts;
  d.error_flags = backend_->error_flags();
  absl::ReaderMutexLock lock(&mu_);
  d.host = backend_->host_map();
  return backend_->Append(d, stream);
}

absl::Status ClientSession::CheckErrors() { return backend_->CheckErrors(); }

}  // namespace hisparse
