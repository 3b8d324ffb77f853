// The prefill side's UCX writer: see import_writer.h.
#include "import_writer.h"

#include <ucp/api/ucp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>

#include "absl/strings/str_cat.h"
#include "hisparse/common/import_pattern.h"

namespace hisparse::bench {
namespace {

absl::Status UcxError(const char* what, ucs_status_t status) {
  return absl::InternalError(absl::StrCat("UCX ", what, ": ", ucs_status_string(status)));
}

constexpr size_t kMaxInFlight = 256;

}  // namespace

struct ImportWriter::Handles {
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  ucp_ep_h ep = nullptr;
  std::deque<void*> in_flight;  // put requests not known complete
};

ImportWriter::ImportWriter() : ucp_(std::make_unique<Handles>()) {}

ImportWriter::~ImportWriter() {
  for (void* r : ucp_->in_flight) (void)Wait(r);
  if (ucp_->ep != nullptr) {
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    (void)Wait(ucp_ep_close_nbx(ucp_->ep, &param));
  }
  if (ucp_->worker != nullptr) ucp_worker_destroy(ucp_->worker);
  if (ucp_->context != nullptr) ucp_cleanup(ucp_->context);
}

absl::StatusOr<std::unique_ptr<ImportWriter>> ImportWriter::Connect(const std::string& worker_address,
                                                                    const std::string& tls) {
  std::unique_ptr<ImportWriter> w(new ImportWriter());
  ucp_config_t* config = nullptr;
  if (ucs_status_t st = ucp_config_read(nullptr, nullptr, &config); st != UCS_OK) return UcxError("config", st);
  if (!tls.empty()) (void)ucp_config_modify(config, "TLS", tls.c_str());
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA;
  const ucs_status_t init = ucp_init(&params, config, &w->ucp_->context);
  ucp_config_release(config);
  if (init != UCS_OK) return UcxError("init", init);
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  if (ucs_status_t st = ucp_worker_create(w->ucp_->context, &wp, &w->ucp_->worker); st != UCS_OK) {
    return UcxError("worker_create", st);
  }
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
  ep.address = reinterpret_cast<const ucp_address_t*>(worker_address.data());
  if (ucs_status_t st = ucp_ep_create(w->ucp_->worker, &ep, &w->ucp_->ep); st != UCS_OK) {
    return UcxError("ep_create (to the daemon's worker)", st);
  }
  return w;
}

absl::Status ImportWriter::Wait(void* request) {
  const ucs_status_ptr_t r = static_cast<ucs_status_ptr_t>(request);
  if (r == nullptr) return absl::OkStatus();
  if (UCS_PTR_IS_ERR(r)) return UcxError("request", UCS_PTR_STATUS(r));
  ucs_status_t st;
  while ((st = ucp_request_check_status(r)) == UCS_INPROGRESS) ucp_worker_progress(ucp_->worker);
  ucp_request_free(r);
  return st == UCS_OK ? absl::OkStatus() : UcxError("request", st);
}

absl::Status ImportWriter::Put(const v1::ImportGrant& grant, const std::vector<std::vector<uint8_t>>& layers) {
  const uint64_t rb = grant.record_bytes(), per_page = grant.records_per_page();
  if (layers.size() != static_cast<size_t>(grant.layers_size()) || per_page == 0) {
    return absl::InvalidArgumentError("the records do not match the grant's layers");
  }
  std::vector<ucp_rkey_h> rkeys;
  absl::Status status;
  for (const v1::ImportRegion& region : grant.regions()) {
    ucp_rkey_h rkey = nullptr;
    if (ucs_status_t st = ucp_ep_rkey_unpack(ucp_->ep, region.rkey().data(), &rkey); st != UCS_OK) {
      status = UcxError("ep_rkey_unpack", st);
      break;
    }
    rkeys.push_back(rkey);
  }
  for (int l = 0; status.ok() && l < grant.layers_size(); ++l) {
    const v1::ImportLayer& layer = grant.layers(l);
    if (layers[l].size() < uint64_t{grant.capacity_tokens()} * rb) {
      status = absl::InvalidArgumentError(absl::StrCat("layer ", l, ": fewer records than the grant covers"));
      break;
    }
    for (int i = 0; status.ok() && i < layer.page_addr_size(); ++i) {
      const uint64_t first = uint64_t(i) * per_page;
      const uint64_t count = std::min<uint64_t>(per_page, grant.capacity_tokens() - first);
      if (layer.page_region(i) >= rkeys.size()) {
        status = absl::InvalidArgumentError("a page names a region the grant does not have");
        break;
      }
      ucp_request_param_t param{};
      ucs_status_ptr_t r = ucp_put_nbx(ucp_->ep, layers[l].data() + first * rb, count * rb, layer.page_addr(i),
                                       rkeys[layer.page_region(i)], &param);
      if (UCS_PTR_IS_ERR(r)) {
        status = UcxError("put_nbx", UCS_PTR_STATUS(r));
        break;
      }
      if (r != nullptr) ucp_->in_flight.push_back(r);
      while (status.ok() && ucp_->in_flight.size() > kMaxInFlight) {
        status = Wait(ucp_->in_flight.front());
        ucp_->in_flight.pop_front();
      }
    }
  }
  // Puts must complete before their rkeys go (a put in flight may still use its key).
  while (!ucp_->in_flight.empty()) {
    absl::Status st = Wait(ucp_->in_flight.front());
    ucp_->in_flight.pop_front();
    if (status.ok()) status = st;
  }
  for (ucp_rkey_h rkey : rkeys) ucp_rkey_destroy(rkey);
  return status;
}

absl::Status ImportWriter::Flush() {
  ucp_request_param_t param{};
  return Wait(ucp_ep_flush_nbx(ucp_->ep, &param));
}

std::vector<std::vector<uint8_t>> PatternRecords(const v1::ImportGrant& grant, uint64_t seed) {
  std::vector<std::vector<uint8_t>> layers(grant.num_layers());
  const uint32_t rb = grant.record_bytes();
  for (uint32_t l = 0; l < grant.num_layers(); ++l) {
    layers[l].resize(uint64_t{grant.capacity_tokens()} * rb);
    for (uint32_t p = 0; p < grant.capacity_tokens(); ++p) {
      FillImportRecord(layers[l].data() + uint64_t{p} * rb, rb, seed, grant.request_id(), l, p);
    }
  }
  return layers;
}

double MemcpyLikeImport(const v1::ImportGrant& grant, const std::vector<std::vector<uint8_t>>& layers) {
  const uint64_t rb = grant.record_bytes(), per_page = grant.records_per_page();
  std::vector<std::vector<uint8_t>> dst(layers.size());
  for (size_t l = 0; l < layers.size(); ++l) dst[l].assign(layers[l].size(), 1);  // touched before timing
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t l = 0; l < layers.size(); ++l) {
    for (uint64_t first = 0; first < grant.capacity_tokens(); first += per_page) {
      const uint64_t count = std::min<uint64_t>(per_page, grant.capacity_tokens() - first);
      std::memcpy(dst[l].data() + first * rb, layers[l].data() + first * rb, count * rb);
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Keep the copies observable.
  volatile uint8_t sink = dst.empty() || dst[0].empty() ? 0 : dst[0][0];
  (void)sink;
  return s;
}

}  // namespace hisparse::bench
