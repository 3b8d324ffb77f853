// The C ABI's data-path calls (hisparse.h): RESOLVE, the prefill stores, the decode appends,
// prefetch, prewarm, a record's address, the device's deferred errors (hs_check_errors), and TOP-K, the
// one of them without a session. Each checks
// its arguments and hands them to ClientSession, whose device backend does the work (on the
// caller's stream where the call takes one); none of them makes an RPC.
#include <cstdint>
#include <string>

#include "c_api_internal.h"
#include "client_session.h"
#include "device_backend.h"
#include "hisparse/hisparse.h"
#include "hisparse/kernels/topk.h"

using hisparse::c_api::Fail;
using hisparse::c_api::Guard;
using hisparse::c_api::kPrewarmArgsV1;
using hisparse::c_api::kResolveArgsV1;
using hisparse::c_api::kStoreIndexedArgsV1;
using hisparse::c_api::kTopkArgsV1;
using hisparse::c_api::ReadSized;
using hisparse::c_api::SizeOk;
using hisparse::c_api::ToResult;

extern "C" {

hs_result hs_record_ptr(hs_session* s, uint64_t request_id, uint32_t layer, uint32_t position, void** out) {
  return Guard([&] {
    if (s == nullptr || out == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "session and out must not be NULL");
    auto p = s->Get()->RecordPtr(request_id, layer, position);
    if (!p.ok()) return ToResult(p.status());
    *out = *p;
    return HS_OK;
  });
}

hs_result hs_resolve(hs_session* s, const hs_resolve_args* args) {
  return Guard([&] {
    if (s == nullptr || args == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "session and args must not be NULL");
    if (!SizeOk(args->struct_size, kResolveArgsV1)) {
      return Fail(HS_ERR_INVALID_ARGUMENT, "hs_resolve_args.struct_size is too small: use HS_RESOLVE_ARGS_INIT");
    }
    return ToResult(s->Get()->Resolve(ReadSized(*args)));
  });
}

hs_result hs_topk(const hs_topk_args* args) {
  return Guard([&] {
    if (args == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "args must not be NULL");
    if (!SizeOk(args->struct_size, kTopkArgsV1)) {
      return Fail(HS_ERR_INVALID_ARGUMENT, "hs_topk_args.struct_size is too small: use HS_TOPK_ARGS_INIT");
    }
    const hs_topk_args a = ReadSized(*args);
    if (a.device < -1) return Fail(HS_ERR_INVALID_ARGUMENT, "hs_topk_args.device must be -1 (host) or a CUDA device");
    hisparse::TopkDesc d;
    d.scores = a.scores;
    d.ld = a.ld;
    d.cols = a.cols;
    d.rows = a.max_batch;
    d.k = a.k;
    d.batch_size = a.batch_size;
    d.seq_lens = a.seq_lens;
    d.positions = a.positions;
    d.after_count = a.after_count;
    d.after_target = a.after_target;
    if (const std::string why = hisparse::CheckTopkDesc(d); !why.empty()) {
      return Fail(HS_ERR_INVALID_ARGUMENT, ("hs_topk: " + why).c_str());
    }
    if (a.device == -1 && a.after_count != nullptr) {
      return Fail(HS_ERR_INVALID_ARGUMENT, "hs_topk: after_count is for device memory (a kernel's count)");
    }
    if (a.device == -1) {
      hisparse::TopkReference(d);
      return HS_OK;
    }
    return ToResult(hisparse::LaunchTopkOn(a.device, d, a.stream));
  });
}

hs_result hs_store(hs_session* s, uint64_t request_id, int32_t start_pos, int32_t num_tokens, int32_t seq_len_after,
                   const void* src, int64_t src_layer_stride, int64_t src_token_stride, void* stream) {
  return Guard([&] {
    if (s == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "session is NULL");
    return ToResult(s->Get()->Store(request_id, start_pos, num_tokens, seq_len_after, src, src_layer_stride,
                                    src_token_stride, stream));
  });
}

hs_result hs_store_indexed(hs_session* s, const hs_store_indexed_args* args) {
  return Guard([&] {
    if (s == nullptr || args == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "session and args must not be NULL");
    if (!SizeOk(args->struct_size, kStoreIndexedArgsV1)) {
      return Fail(HS_ERR_INVALID_ARGUMENT,
                  "hs_store_indexed_args.struct_size is too small: use HS_STORE_INDEXED_ARGS_INIT");
    }
    return ToResult(s->Get()->StoreIndexed(ReadSized(*args)));
  });
}

hs_result hs_append(hs_session* s, uint32_t layer, int32_t max_batch, const int32_t* batch_size, const int32_t* rows,
                    const int32_t* seq_lens, const void* src, int64_t src_stride, void* stream) {
  return Guard([&] {
    if (s == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "session is NULL");
    return ToResult(s->Get()->Append(layer, max_batch, batch_size, rows, seq_lens, nullptr, src, src_stride, stream));
  });
}

hs_result hs_append_tokens(hs_session* s, uint32_t layer, int32_t max_batch, const int32_t* batch_size,
                           const int32_t* rows, const int32_t* seq_lens, const int32_t* token_counts, const void* src,
                           int64_t src_stride, void* stream) {
  return Guard([&] {
    if (s == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "session is NULL");
    return ToResult(
        s->Get()->Append(layer, max_batch, batch_size, rows, seq_lens, token_counts, src, src_stride, stream));
  });
}

hs_result hs_prefetch(hs_session* s, uint32_t layer, void* stream) {
  return Guard([&] {
    if (s == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "session must not be NULL");
    return ToResult(s->Get()->Prefetch(layer, stream));
  });
}

hs_result hs_prewarm(hs_session* s, const hs_prewarm_args* args) {
  return Guard([&] {
    if (s == nullptr || args == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "session and args must not be NULL");
    if (!SizeOk(args->struct_size, kPrewarmArgsV1)) {
      return Fail(HS_ERR_INVALID_ARGUMENT, "hs_prewarm_args.struct_size is too small: use HS_PREWARM_ARGS_INIT");
    }
    return ToResult(s->Get()->Prewarm(ReadSized(*args)));
  });
}

hs_result hs_check_errors(hs_session* s) {
  return Guard([&] {
    if (s == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "session is NULL");
    return ToResult(s->Get()->CheckErrors());
  });
}

}  // extern "C"
