// The prefill side's UCX writer: see import_writer.h.
#include "import_writer.h"

#include <ucp/api/ucp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>

#include "absl/strings/str_cat.h"
#include "hisparse/common/import_pattern.h"

namespace hisparse::bench {
namespace {

absl::Status UcxError(const char* what, ucs_status_t status) {
  return absl::InternalError(absl::StrCat("UCX ", what, ": ", ucs_status_string(status)));
}

// 16 writes of up to 1 MiB unanswered: what one writer can make the daemon's UCX buffer.
constexpr size_t kMaxUnanswered = 16;
constexpr uint64_t kWriteBytes = uint64_t{1} << 20;
constexpr int kReplyTimeoutMs = 10000;

ucs_status_t ReplyHandler(void* arg, const void* header, size_t header_length, void* /*data*/, size_t /*length*/,
                          const ucp_am_recv_param_t* /*param*/) {
  static_cast<ImportWriter*>(arg)->OnReply(header, header_length);
  return UCS_OK;
}

using Clock = std::chrono::steady_clock;

}  // namespace

struct ImportWriter::Handles {
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  ucp_ep_h ep = nullptr;
};

ImportWriter::ImportWriter() : ucp_(std::make_unique<Handles>()) {}

ImportWriter::~ImportWriter() {
  if (ucp_->ep != nullptr) {
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    (void)Wait(ucp_ep_close_nbx(ucp_->ep, &param), 2000);
  }
  if (ucp_->worker != nullptr) ucp_worker_destroy(ucp_->worker);
  if (ucp_->context != nullptr) ucp_cleanup(ucp_->context);
}

void ImportWriter::OnReply(const void* header, size_t length) {
  absl::StatusOr<ImportReply> r = DecodeImportReply(std::string_view(static_cast<const char*>(header), length));
  if (r.ok()) replies_[r->seq] = r->code;
}

absl::StatusOr<std::unique_ptr<ImportWriter>> ImportWriter::Connect(const std::string& worker_address,
                                                                    const std::string& tls) {
  auto w = ConnectWith(worker_address, tls);
  if (w.ok() || !tls.empty()) return w;
  // UCX's shared memory admits only the daemon's uid (sysv segments are 0600, posix ones are
  // opened through /proc/<pid>/fd): another uid reaches the worker over tcp.
  std::fprintf(stderr, "hisparse-bench import: %s; retrying over tcp\n", w.status().ToString().c_str());
  return ConnectWith(worker_address, "tcp");
}

absl::StatusOr<std::unique_ptr<ImportWriter>> ImportWriter::ConnectWith(const std::string& worker_address,
                                                                        const std::string& tls) {
  std::unique_ptr<ImportWriter> w(new ImportWriter());
  w->transports_ = tls.empty() ? "default" : tls;
  ucp_config_t* config = nullptr;
  if (ucs_status_t st = ucp_config_read(nullptr, nullptr, &config); st != UCS_OK) return UcxError("config", st);
  if (!tls.empty()) (void)ucp_config_modify(config, "TLS", tls.c_str());
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_RMA;  // RMA for ForgedPut only
  const ucs_status_t init = ucp_init(&params, config, &w->ucp_->context);
  ucp_config_release(config);
  if (init != UCS_OK) return UcxError("init", init);
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  if (ucs_status_t st = ucp_worker_create(w->ucp_->context, &wp, &w->ucp_->worker); st != UCS_OK) {
    return UcxError("worker_create", st);
  }
  ucp_am_handler_param_t hp{};
  hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
  hp.id = kImportReplyAmId;
  hp.cb = ReplyHandler;
  hp.arg = w.get();
  if (ucs_status_t st = ucp_worker_set_am_recv_handler(w->ucp_->worker, &hp); st != UCS_OK) {
    return UcxError("worker_set_am_recv_handler", st);
  }
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
  ep.address = reinterpret_cast<const ucp_address_t*>(worker_address.data());
  if (ucs_status_t st = ucp_ep_create(w->ucp_->worker, &ep, &w->ucp_->ep); st != UCS_OK) {
    return UcxError("ep_create (to the daemon's worker)", st);
  }
  return w;
}

absl::Status ImportWriter::Wait(void* request, int timeout_ms) {
  const ucs_status_ptr_t r = static_cast<ucs_status_ptr_t>(request);
  if (r == nullptr) return absl::OkStatus();
  if (UCS_PTR_IS_ERR(r)) return UcxError("request", UCS_PTR_STATUS(r));
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms < 0 ? 0 : timeout_ms);
  ucs_status_t st;
  while ((st = ucp_request_check_status(r)) == UCS_INPROGRESS) {
    ucp_worker_progress(ucp_->worker);
    if (timeout_ms >= 0 && Clock::now() > deadline) {
      ucp_request_cancel(ucp_->worker, r);
      ucp_request_free(r);
      return absl::DeadlineExceededError("a UCX request did not complete in time");
    }
  }
  ucp_request_free(r);
  return st == UCS_OK ? absl::OkStatus() : UcxError("request", st);
}

bool ImportWriter::AwaitReply(uint64_t seq, int timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (replies_.count(seq) == 0) {
    if (ucp_worker_progress(ucp_->worker) == 0 && Clock::now() > deadline) return false;
  }
  return true;
}

absl::Status ImportWriter::Write(const v1::ImportGrant& grant, const std::vector<std::vector<uint8_t>>& layers) {
  const uint64_t rb = grant.record_bytes(), per_page = grant.records_per_page();
  if (layers.size() != grant.num_layers() || per_page == 0 || rb == 0) {
    return absl::InvalidArgumentError("the records do not match the grant's layers");
  }
  // Whole pages per message, up to kWriteBytes (and the grant's bound): fewer, larger messages.
  const uint64_t max_bytes =
      std::min<uint64_t>(kWriteBytes, grant.max_write_bytes() ? grant.max_write_bytes() : kMaxImportWriteBytes);
  const uint64_t per_message = std::max<uint64_t>(1, std::max<uint64_t>(1, max_bytes / (per_page * rb)) * per_page);
  struct InFlight {
    uint64_t seq;
    std::unique_ptr<std::string> header;  // UCX reads it until the send completes
    void* request;
  };
  std::deque<InFlight> in_flight;
  absl::Status status;
  auto retire = [&](InFlight& f) {
    absl::Status st = Wait(f.request, kReplyTimeoutMs);
    if (st.ok() && !AwaitReply(f.seq, kReplyTimeoutMs)) {
      st = absl::DeadlineExceededError(
          absl::StrCat("no answer from the daemon to write ", f.seq, " in ", kReplyTimeoutMs, " ms"));
    }
    if (st.ok() && replies_[f.seq] != ImportCode::kOk) {
      st = absl::PermissionDeniedError(
          absl::StrCat("the daemon refused write ", f.seq, ": ", ImportCodeName(replies_[f.seq])));
    }
    replies_.erase(f.seq);
    if (status.ok()) status = st;
  };
  for (uint32_t l = 0; status.ok() && l < grant.num_layers(); ++l) {
    if (layers[l].size() < uint64_t{grant.capacity_tokens()} * rb) {
      status = absl::InvalidArgumentError(absl::StrCat("layer ", l, ": fewer records than the grant covers"));
      break;
    }
    for (uint64_t first = 0; status.ok() && first < grant.capacity_tokens(); first += per_message) {
      const uint64_t count = std::min<uint64_t>(per_message, grant.capacity_tokens() - first);
      ImportWrite w{
          grant.grant_id(),         next_seq_++, l, static_cast<uint32_t>(first), static_cast<uint32_t>(count),
          static_cast<uint32_t>(rb)};
      InFlight f{w.seq, std::make_unique<std::string>(EncodeImportWrite(w)), nullptr};
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      param.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
      ucs_status_ptr_t r = ucp_am_send_nbx(ucp_->ep, kImportWriteAmId, f.header->data(), f.header->size(),
                                           layers[l].data() + first * rb, count * rb, &param);
      if (UCS_PTR_IS_ERR(r)) {
        status = UcxError("am_send_nbx", UCS_PTR_STATUS(r));
        break;
      }
      f.request = r;
      in_flight.push_back(std::move(f));
      while (in_flight.size() > kMaxUnanswered) {
        retire(in_flight.front());
        in_flight.pop_front();
      }
    }
  }
  while (!in_flight.empty()) {
    retire(in_flight.front());
    in_flight.pop_front();
  }
  return status;
}

absl::StatusOr<ImportCode> ImportWriter::SendOne(const ImportWrite& w, const uint8_t* payload, size_t bytes,
                                                 bool rendezvous) {
  const std::string header = EncodeImportWrite(w);
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_AM_SEND_FLAG_REPLY | (rendezvous ? UCP_AM_SEND_FLAG_RNDV : UCP_AM_SEND_FLAG_EAGER);
  replies_.erase(w.seq);
  ucs_status_ptr_t r =
      ucp_am_send_nbx(ucp_->ep, kImportWriteAmId, header.data(), header.size(), payload, bytes, &param);
  if (!AwaitReply(w.seq, kReplyTimeoutMs)) {
    (void)Wait(r, 100);
    return absl::DeadlineExceededError(absl::StrCat("no answer to write ", w.seq));
  }
  if (absl::Status st = Wait(r, kReplyTimeoutMs); !st.ok()) return st;
  const ImportCode code = replies_[w.seq];
  replies_.erase(w.seq);
  return code;
}

absl::Status ImportWriter::ForgedPut(uint64_t remote_addr, size_t bytes) {
  std::vector<uint8_t> junk(bytes, 0xEE);
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = junk.data();
  mp.length = junk.size();
  ucp_mem_h memh = nullptr;
  if (ucs_status_t st = ucp_mem_map(ucp_->context, &mp, &memh); st != UCS_OK) return UcxError("mem_map", st);
  void* packed = nullptr;
  size_t packed_len = 0;
  ucp_rkey_h rkey = nullptr;
  absl::Status status;
  if (ucs_status_t st = ucp_rkey_pack(ucp_->context, memh, &packed, &packed_len); st != UCS_OK) {
    status = UcxError("rkey_pack", st);
  } else if (ucs_status_t st2 = ucp_ep_rkey_unpack(ucp_->ep, packed, &rkey); st2 != UCS_OK) {
    status = UcxError("ep_rkey_unpack", st2);
  }
  if (packed != nullptr) ucp_rkey_buffer_release(packed);
  if (status.ok()) {
    ucp_request_param_t param{};
    // A daemon that serves no RMA never completes the put: wait 3 s, not the write timeout.
    status = Wait(ucp_put_nbx(ucp_->ep, junk.data(), junk.size(), remote_addr, rkey, &param), 3000);
    if (status.ok()) {
      ucp_request_param_t flush{};
      status = Wait(ucp_ep_flush_nbx(ucp_->ep, &flush), 3000);
    }
  }
  if (rkey != nullptr) ucp_rkey_destroy(rkey);
  ucp_mem_unmap(ucp_->context, memh);
  return status;
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
  const auto t0 = Clock::now();
  for (size_t l = 0; l < layers.size(); ++l) {
    for (uint64_t first = 0; first < grant.capacity_tokens(); first += per_page) {
      const uint64_t count = std::min<uint64_t>(per_page, grant.capacity_tokens() - first);
      std::memcpy(dst[l].data() + first * rb, layers[l].data() + first * rb, count * rb);
    }
  }
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  // Keep the copies observable.
  volatile uint8_t sink = dst.empty() || dst[0].empty() ? 0 : dst[0][0];
  (void)sink;
  return s;
}

}  // namespace hisparse::bench
