// The daemon's UCX context, worker and grant registrations: see ucx_import.h.
#include "hisparse/daemon/ucx_import.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

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

}  // namespace

UcxImport::UcxImport(Options options) : options_(std::move(options)), ucp_(std::make_unique<Handles>()) {}

absl::StatusOr<std::unique_ptr<UcxImport>> UcxImport::Start(Options options) {
  std::unique_ptr<UcxImport> self(new UcxImport(std::move(options)));
  ucp_config_t* config = nullptr;
  if (ucs_status_t st = ucp_config_read(nullptr, nullptr, &config); st != UCS_OK) return UcxError("config", st);
  if (!self->options_.tls.empty()) {
    if (ucs_status_t st = ucp_config_modify(config, "TLS", self->options_.tls.c_str()); st != UCS_OK) {
      ucp_config_release(config);
      return absl::InvalidArgumentError(
          absl::StrCat("import.ucx_tls \"", self->options_.tls, "\": ", ucs_status_string(st)));
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  const ucs_status_t init = ucp_init(&params, config, &self->ucp_->context);
  ucp_config_release(config);
  if (init != UCS_OK) return UcxError("init", init);
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;  // every call is under mu_
  if (ucs_status_t st = ucp_worker_create(self->ucp_->context, &wp, &self->ucp_->worker); st != UCS_OK) {
    return UcxError("worker_create", st);
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
            << (self->options_.tls.empty() ? "UCX default" : self->options_.tls) << ")";
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
  for (auto& [id, handles] : grants_) {
    for (void* h : handles) ucp_mem_unmap(ucp_->context, static_cast<ucp_mem_h>(h));
  }
  grants_.clear();
  if (ucp_->worker != nullptr) ucp_worker_destroy(ucp_->worker);
  if (ucp_->context != nullptr) ucp_cleanup(ucp_->context);
}

void UcxImport::ProgressLoop() {
  const int timeout_ms = static_cast<int>(absl::ToInt64Milliseconds(options_.tick));
  for (;;) {
    bool armed;
    {
      absl::MutexLock lock(&mu_);
      while (ucp_worker_progress(ucp_->worker) != 0) {
      }
      armed = ucp_worker_arm(ucp_->worker) == UCS_OK;  // UCS_ERR_BUSY: more events, progress again
    }
    if (options_.on_tick) options_.on_tick();
    if (!armed) continue;
    pollfd fds[2] = {{wakeup_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    (void)::poll(fds, 2, timeout_ms);
    if (fds[1].revents & POLLIN) return;
  }
}

absl::StatusOr<std::vector<ImportTarget::Region>> UcxImport::Register(const std::string& grant_id,
                                                                      const std::vector<Span>& spans) {
  std::vector<Region> regions;
  std::vector<void*> handles;
  absl::MutexLock lock(&mu_);
  if (grants_.contains(grant_id)) return absl::AlreadyExistsError("grant registered twice");
  auto undo = [&] {
    for (void* h : handles) ucp_mem_unmap(ucp_->context, static_cast<ucp_mem_h>(h));
  };
  for (const Span& span : spans) {
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_PROT;
    mp.address = span.addr;
    mp.length = span.bytes;
    // Write-only for the remote side: transports that honour prot (RDMA) refuse remote reads.
    mp.prot = UCP_MEM_MAP_PROT_REMOTE_WRITE | UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_LOCAL_WRITE;
    ucp_mem_h memh = nullptr;
    if (ucs_status_t st = ucp_mem_map(ucp_->context, &mp, &memh); st != UCS_OK) {
      undo();
      return UcxError("mem_map", st);
    }
    handles.push_back(memh);
    void* packed = nullptr;
    size_t packed_len = 0;
    if (ucs_status_t st = ucp_rkey_pack(ucp_->context, memh, &packed, &packed_len); st != UCS_OK) {
      undo();
      return UcxError("rkey_pack", st);
    }
    regions.push_back(Region{reinterpret_cast<uint64_t>(span.addr), span.bytes,
                             std::string(static_cast<const char*>(packed), packed_len)});
    ucp_rkey_buffer_release(packed);
  }
  grants_.emplace(grant_id, std::move(handles));
  return regions;
}

void UcxImport::Unregister(const std::string& grant_id) {
  absl::MutexLock lock(&mu_);
  auto it = grants_.find(grant_id);
  if (it == grants_.end()) return;
  for (void* h : it->second) ucp_mem_unmap(ucp_->context, static_cast<ucp_mem_h>(h));
  grants_.erase(it);
}

}  // namespace hisparse

namespace hisparse {

absl::StatusOr<std::unique_ptr<ImportTarget>> StartImportTarget(const std::string& ucx_tls,
                                                                const std::function<void()>& on_tick) {
  UcxImport::Options options;
  options.tls = ucx_tls;
  options.on_tick = on_tick;
  absl::StatusOr<std::unique_ptr<UcxImport>> started = UcxImport::Start(std::move(options));
  if (!started.ok()) return started.status();
  return std::unique_ptr<ImportTarget>(std::move(*started));
}

}  // namespace hisparse
