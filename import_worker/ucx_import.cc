// The import worker's UCX context, worker and grant table: see ucx_import.h.
#include "import_worker/ucx_import.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <ucp/api/ucp.h>
#include <ucs/config/global_opts.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "hisparse/common/log.h"

namespace hisparse {

struct UcxImport::Handles {
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
};

namespace {

absl::Status UcxError(const char* what, ucs_status_t status) {
  return absl::InternalError(absl::StrCat("UCX ", what, ": ", ucs_status_string(status)));
}

ucs_status_t OnWriteMessage(void* arg, const void* header, size_t header_length, void* data, size_t length,
                            const ucp_am_recv_param_t* param) {
  auto* self = static_cast<UcxImport*>(arg);
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  void* reply_ep = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) != 0 ? param->reply_ep : nullptr;
  self->OnWrite(header, header_length, data, length, rndv, reply_ep);
  // The payload was copied or refused: UCX releases it (a rendezvous descriptor unreceived: the
  // writer's memory is never read).
  return UCS_OK;
}

void ReplySent(void* request, ucs_status_t /*status*/, void* user_data) {
  delete static_cast<std::string*>(user_data);
  ucp_request_free(request);
}

}  // namespace

UcxImport::UcxImport(Options options) : options_(std::move(options)), ucp_(std::make_unique<Handles>()) {}

absl::StatusOr<std::unique_ptr<UcxImport>> UcxImport::Start(Options options) {
  std::unique_ptr<UcxImport> self(new UcxImport(std::move(options)));
  const Options& o = self->options_;
  // A peer's message to a handler this worker does not install (UCX's software put or get, which
  // need UCP_FEATURE_RMA) is dropped with a warning and a backtrace per fragment: a flood a peer
  // could cause at will. UCX logs errors only; the worker counts and logs refused writes itself.
  if (ucs_status_t st = ucs_global_opts_set_value("LOG_LEVEL", "error"); st != UCS_OK) {
    LOG(WARNING) << "import: cannot lower UCX's log level: " << ucs_status_string(st);
  }
  ucp_config_t* config = nullptr;
  if (ucs_status_t st = ucp_config_read(nullptr, nullptr, &config); st != UCS_OK) return UcxError("config", st);
  struct Setting {
    const char* name;
    const std::string* value;
    const char* key;
  };
  const Setting settings[] = {{"TLS", &o.ucx_tls, "import.ucx_tls"},
                              {"NET_DEVICES", &o.ucx_net_devices, "import.ucx_net_devices"}};
  for (const Setting& s : settings) {
    if (s.value->empty()) continue;
    if (ucs_status_t st = ucp_config_modify(config, s.name, s.value->c_str()); st != UCS_OK) {
      ucp_config_release(config);
      return absl::InvalidArgumentError(absl::StrCat(s.key, " \"", *s.value, "\": ", ucs_status_string(st)));
    }
  }
  // Peers name UCX's requests and endpoints on the wire by id; indirect ids are looked up in a
  // table rather than taken as pointers, so a forged id is refused instead of dereferenced.
  if (ucs_status_t st = ucp_config_modify(config, "PROTO_INDIRECT_ID", "on"); st != UCS_OK) {
    LOG(WARNING) << "import: this UCX has no PROTO_INDIRECT_ID (" << ucs_status_string(st) << ")";
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;  // no RMA: see ucx_import.h
  const ucs_status_t init = ucp_init(&params, config, &self->ucp_->context);
  ucp_config_release(config);
  if (init != UCS_OK) return UcxError("init", init);
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;  // every call is under mu_
  if (ucs_status_t st = ucp_worker_create(self->ucp_->context, &wp, &self->ucp_->worker); st != UCS_OK) {
    return UcxError("worker_create", st);
  }
  ucp_am_handler_param_t hp{};
  hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS | UCP_AM_HANDLER_PARAM_FIELD_CB |
                  UCP_AM_HANDLER_PARAM_FIELD_ARG;
  hp.id = kImportWriteAmId;
  hp.flags = UCP_AM_FLAG_WHOLE_MSG;
  hp.cb = OnWriteMessage;
  hp.arg = self.get();
  if (ucs_status_t st = ucp_worker_set_am_recv_handler(self->ucp_->worker, &hp); st != UCS_OK) {
    return UcxError("worker_set_am_recv_handler", st);
  }
  ucp_address_t* address = nullptr;
  size_t address_len = 0;
  if (ucs_status_t st = ucp_worker_get_address(self->ucp_->worker, &address, &address_len); st != UCS_OK) {
    return UcxError("worker_get_address", st);
  }
  self->worker_address_.assign(reinterpret_cast<const char*>(address), address_len);
  ucp_worker_release_address(self->ucp_->worker, address);
  if (ucs_status_t st = ucp_worker_get_efd(self->ucp_->worker, &self->wakeup_fd_); st != UCS_OK) {
    return UcxError("worker_get_efd", st);
  }
  self->stop_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (self->stop_fd_ < 0) return absl::InternalError("eventfd for the UCX progress thread failed");
  self->progress_ = std::thread([raw = self.get()] { raw->ProgressLoop(); });
  LOG(INFO) << "import: UCX worker ready (" << address_len << "-byte address, transports "
            << (o.ucx_tls.empty() ? "UCX default" : o.ucx_tls) << ", net devices "
            << (o.ucx_net_devices.empty() ? "UCX default" : o.ucx_net_devices)
            << "); writes arrive as checked active messages, no memory is registered";
  return self;
}

UcxImport::~UcxImport() {
  if (progress_.joinable()) {
    const uint64_t one = 1;
    (void)!::write(stop_fd_, &one, sizeof(one));
    progress_.join();
  }
  if (stop_fd_ >= 0) ::close(stop_fd_);
  absl::MutexLock lock(&mu_);
  grants_.clear();
  if (ucp_->worker != nullptr) ucp_worker_destroy(ucp_->worker);
  if (ucp_->context != nullptr) ucp_cleanup(ucp_->context);
}

// The progress thread sleeps in poll() whenever the worker is armed. ucp_worker_arm answers
// UCS_ERR_BUSY while events are pending (progress again at once), but after a writer died
// mid-transfer UCX 1.13 was seen answering BUSY (or an error) on every call with nothing to
// progress: the thread then read an empty eventfd in a loop, a whole core for as long as the
// daemon ran. So a run of kMaxBusyRounds unarmed rounds, or any error, ends in a short poll.
namespace {
constexpr int kMaxBusyRounds = 64;
constexpr int kUnarmedPollMs = 1;
}  // namespace

void UcxImport::ProgressLoop() {
  const int timeout_ms = static_cast<int>(absl::ToInt64Milliseconds(options_.tick));
  uint64_t refused_logged = 0;
  int busy_rounds = 0;
  ucs_status_t last_arm_error = UCS_OK;
  for (;;) {
    ucs_status_t arm;
    Counters seen;
    {
      absl::MutexLock lock(&mu_);
      while (ucp_worker_progress(ucp_->worker) != 0) {
      }
      arm = ucp_worker_arm(ucp_->worker);
      seen = counters_;
    }
    if (arm != UCS_OK && arm != UCS_ERR_BUSY && arm != last_arm_error) {
      LOG(WARNING) << "import: arming the UCX worker failed: " << ucs_status_string(arm) << "; polling every "
                   << kUnarmedPollMs << " ms until it arms again";
    }
    last_arm_error = arm == UCS_ERR_BUSY ? last_arm_error : arm;
    if (seen.refused != refused_logged) {
      LOG(WARNING) << "import: refused " << seen.refused - refused_logged
                   << " write(s) (last: " << ImportCodeName(seen.last_refusal) << "); " << seen.written
                   << " accepted since start";
      refused_logged = seen.refused;
    }
    if (arm == UCS_ERR_BUSY && ++busy_rounds < kMaxBusyRounds) continue;
    busy_rounds = 0;
    pollfd fds[2] = {{wakeup_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    (void)::poll(fds, 2, arm == UCS_OK ? timeout_ms : kUnarmedPollMs);
    if (fds[1].revents & POLLIN) return;
  }
}

void UcxImport::OnWrite(const void* header, size_t header_length, void* data, size_t length, bool rendezvous,
                        void* reply_ep) {
  mu_.AssertHeld();  // only ever called from ucp_worker_progress, under mu_
  absl::StatusOr<ImportWrite> w =
      DecodeImportWrite(std::string_view(static_cast<const char*>(header), header != nullptr ? header_length : 0));
  ImportCode code;
  if (rendezvous) {
    code = ImportCode::kNotEager;
  } else if (!w.ok()) {
    code = ImportCode::kMalformed;
  } else {
    code = Apply(*w, static_cast<const uint8_t*>(data), data != nullptr ? length : 0);
  }
  if (code == ImportCode::kOk) {
    ++counters_.written;
    counters_.bytes += length;
  } else {
    ++counters_.refused;
    counters_.last_refusal = code;
  }
  if (reply_ep != nullptr) Reply(reply_ep, w.ok() ? w->seq : 0, code);
}

ImportCode UcxImport::Apply(const ImportWrite& w, const uint8_t* payload, size_t length) {
  auto it = grants_.find(w.grant_id);
  if (it == grants_.end()) return ImportCode::kUnknownGrant;
  const Grant& g = it->second;
  if (absl::Now() >= g.expires) return ImportCode::kExpired;
  const ImportPlan plan = PlanImportWrite(g.layout, w, length);
  if (plan.code != ImportCode::kOk) return plan.code;
  // PlanImportWrite bounds every chunk by its page and the layout; Register checked that the page
  // table holds ImportPagesPerLayer pages of page_bytes per layer.
  const std::vector<uint8_t*>& pages = g.pages[w.layer];
  for (const ImportChunk& c : plan.chunks) std::memcpy(pages[c.page] + c.page_offset, payload + c.src_offset, c.bytes);
  return ImportCode::kOk;
}

void UcxImport::Reply(void* reply_ep, uint64_t seq, ImportCode code) {
  auto* bytes = new std::string(EncodeImportReply(ImportReply{seq, code}));
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  param.cb.send = ReplySent;
  param.user_data = bytes;
  param.flags = UCP_AM_SEND_FLAG_EAGER;
  ucs_status_ptr_t r = ucp_am_send_nbx(static_cast<ucp_ep_h>(reply_ep), kImportReplyAmId, bytes->data(), bytes->size(),
                                       nullptr, 0, &param);
  if (!UCS_PTR_IS_PTR(r)) delete bytes;  // done (or failed) at once: no callback comes
}

absl::Status UcxImport::Register(const std::string& grant_id, const Grant& grant) {
  const ImportLayout& l = grant.layout;
  const uint64_t per_layer = ImportPagesPerLayer(l);
  if (l.record_bytes == 0 || per_layer == 0 || grant.pages.size() != l.num_layers ||
      grant.page_bytes < uint64_t{l.records_per_page} * l.record_bytes) {
    return absl::InvalidArgumentError("an import grant's page table does not match its layout");
  }
  for (const auto& layer : grant.pages) {
    if (layer.size() != per_layer) return absl::InvalidArgumentError("an import grant's layer lacks pages");
    for (const uint8_t* p : layer) {
      if (p == nullptr) return absl::InvalidArgumentError("an import grant names a null page");
    }
  }
  absl::MutexLock lock(&mu_);
  if (!grants_.emplace(grant_id, grant).second) return absl::AlreadyExistsError("grant registered twice");
  return absl::OkStatus();
}

void UcxImport::Unregister(const std::string& grant_id) {
  absl::MutexLock lock(&mu_);
  grants_.erase(grant_id);
}

}  // namespace hisparse
