// A minimal engine process for the two-process GPU tests: opens a CUDA-backend session on GPU 0
// against the daemon at argv[1] (whose arena is the daemon's GPU memory), prefills one request,
// and runs RESOLVE decode steps.
//   gpu_engine <address> check <steps> [request_id] [foreign_id]: checks every output slot's bytes
//     against the host record of its position, prints "OK hits=H misses=M checked=C arena=KIND"
//     (counters from the daemon's stats; KIND how the arena was shared). With foreign_id (another
//     engine's request), first checks that this session cannot name it: extend, release and
//     record_ptr all answer NOT_FOUND.
//   gpu_engine <address> loop: prints "READY" after the first step, then decodes until killed.
//   gpu_engine <address> hold <steps> [request_id]: decodes <steps> steps, prints "SUM <checksum>"
//     of its whole slot-record region, waits for a line on stdin (another engine decodes
//     meanwhile), prints "SUM <checksum>" again and exits: the two sums must be equal.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "hisparse/hisparse.h"

namespace {

constexpr uint32_t kLayers = 2, kRecord = 64, kK = 4, kSlots = 8, kContext = 64;

int Die(const char* what, hs_result r) {
  std::fprintf(stderr, "gpu_engine: %s failed (%d): %s\n", what, static_cast<int>(r), hs_last_error());
  return 2;
}

const char* KindName(hs_arena_kind k) {
  return k == HS_ARENA_CUDA_VMM ? "cuda-vmm" : k == HS_ARENA_CUDA_IPC ? "cuda-ipc" : "host";
}

// FNV-1a over the session's slot records (every row, layer and slot), copied from the GPU.
uint64_t Checksum(const hs_session_info& info) {
  const size_t bytes = size_t{1} * kLayers * (kSlots + 1) * info.record_stride;  // max_requests = 1
  std::vector<uint8_t> h(bytes);
  cudaMemcpy(h.data(), info.slot_base, bytes, cudaMemcpyDeviceToHost);
  uint64_t x = 1469598103934665603ull;
  for (uint8_t b : h) x = (x ^ b) * 1099511628211ull;
  return x;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  const std::string mode = argv[2];
  const int steps = argc > 3 ? std::atoi(argv[3]) : 0;
  const uint64_t id = argc > 4 ? std::strtoull(argv[4], nullptr, 10) : 1;
  const uint64_t foreign = argc > 5 ? std::strtoull(argv[5], nullptr, 10) : 0;
  hs_session_options o = HS_SESSION_OPTIONS_INIT;
  o.daemon_address = argv[1];
  o.engine_name = "gpu_engine";
  o.gpu = 0;
  o.num_layers = kLayers;
  o.record_bytes = kRecord;
  o.k = kK;
  o.slots = kSlots;
  o.max_requests = 1;
  o.backend = HS_BACKEND_CUDA;
  hs_session* s = nullptr;
  if (hs_result r = hs_session_open(&o, &s); r != HS_OK) return Die("hs_session_open", r);
  hs_session_info info = HS_SESSION_INFO_INIT;
  if (hs_result r = hs_session_get_info(s, &info); r != HS_OK) return Die("hs_session_get_info", r);
  if (foreign != 0) {
    // Requests are named per session: another engine's id means nothing here.
    hs_request_info ri = HS_REQUEST_INFO_INIT;
    void* p = nullptr;
    const hs_result ext = hs_extend(s, foreign, kContext * 2, &ri);
    const hs_result rel = hs_release(s, foreign);
    const hs_result ptr = hs_record_ptr(s, foreign, 0, 0, &p);
    if (ext != HS_ERR_NOT_FOUND || rel != HS_ERR_NOT_FOUND || ptr != HS_ERR_NOT_FOUND) {
      std::fprintf(stderr, "gpu_engine: another engine's request %llu answered extend %d, release %d, record_ptr %d\n",
                   static_cast<unsigned long long>(foreign), ext, rel, ptr);
      return 4;
    }
  }
  hs_request_info req = HS_REQUEST_INFO_INIT;
  if (hs_result r = hs_admit(s, id, kContext, kContext, &req); r != HS_OK) return Die("hs_admit", r);

  // Prefill: record (layer, token) filled with a byte pattern of its own.
  std::vector<uint8_t> host(size_t{kLayers} * kContext * kRecord);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint8_t>((i / kRecord) * 7 + i % 13);
  void* src = nullptr;
  cudaMalloc(&src, host.size());
  cudaMemcpy(src, host.data(), host.size(), cudaMemcpyHostToDevice);
  if (hs_result r = hs_store(s, id, 0, kContext, kContext, src, int64_t{kContext} * kRecord, kRecord, nullptr);
      r != HS_OK) {
    return Die("hs_store", r);
  }
  int32_t *rows = nullptr, *seq = nullptr, *pos = nullptr, *out = nullptr;
  cudaMalloc(&rows, sizeof(int32_t));
  cudaMalloc(&seq, sizeof(int32_t));
  cudaMalloc(&pos, kK * sizeof(int32_t));
  cudaMalloc(&out, kK * sizeof(int32_t));
  const int32_t row = static_cast<int32_t>(req.row), seq_len = kContext;
  cudaMemcpy(rows, &row, sizeof(row), cudaMemcpyHostToDevice);
  cudaMemcpy(seq, &seq_len, sizeof(seq_len), cudaMemcpyHostToDevice);
  std::mt19937 rng(7);
  uint64_t checked = 0;
  for (int step = 0; mode == "loop" || step < steps; ++step) {
    for (uint32_t layer = 0; layer < kLayers; ++layer) {
      int32_t p[kK];
      // Distinct positions (RESOLVE refuses a position selected twice in a row): one per 16-token band.
      for (uint32_t j = 0; j < kK; ++j) p[j] = static_cast<int32_t>(j * 16 + rng() % 15);
      p[kK - 1] = kContext - 1;  // the newest token: always selected
      cudaMemcpy(pos, p, sizeof(p), cudaMemcpyHostToDevice);
      hs_resolve_args a = HS_RESOLVE_ARGS_INIT;
      a.layer = layer;
      a.max_batch = 1;
      a.rows = rows;
      a.seq_lens = seq;
      a.positions = pos;
      a.out_slots = out;
      if (hs_result r = hs_resolve(s, &a); r != HS_OK) return Die("hs_resolve", r);
      if (hs_result r = hs_check_errors(s); r != HS_OK) return Die("hs_check_errors", r);
      if (mode != "check") continue;
      int32_t slots[kK];
      cudaMemcpy(slots, out, sizeof(slots), cudaMemcpyDeviceToHost);
      for (uint32_t j = 0; j < kK; ++j) {
        if (slots[j] < 0 || slots[j] > static_cast<int32_t>(kSlots)) {
          std::fprintf(stderr, "gpu_engine: slot %d out of range\n", slots[j]);
          return 3;
        }
        uint8_t got[kRecord];
        const uint8_t* dev = static_cast<const uint8_t*>(info.slot_base) +
                             ((size_t{req.row} * kLayers + layer) * (kSlots + 1) + slots[j]) * info.record_stride;
        cudaMemcpy(got, dev, kRecord, cudaMemcpyDeviceToHost);
        void* want = nullptr;
        if (hs_result r = hs_record_ptr(s, id, layer, static_cast<uint32_t>(p[j]), &want); r != HS_OK) {
          return Die("hs_record_ptr", r);
        }
        if (std::memcmp(got, want, kRecord) != 0 ||
            std::memcmp(got, host.data() + (size_t{layer} * kContext + p[j]) * kRecord, kRecord) != 0) {
          std::fprintf(stderr, "gpu_engine: step %d layer %u position %d: slot %d holds the wrong record\n", step,
                       layer, p[j], slots[j]);
          return 3;
        }
        ++checked;
      }
    }
    if (step == 0 && mode == "loop") {
      std::printf("READY\n");
      std::fflush(stdout);
    }
  }
  if (mode == "hold") {
    std::printf("SUM %016llx\n", static_cast<unsigned long long>(Checksum(info)));
    std::fflush(stdout);
    char line[64];
    if (std::fgets(line, sizeof(line), stdin) == nullptr) return 5;
    std::printf("SUM %016llx\n", static_cast<unsigned long long>(Checksum(info)));
    hs_session_close(s);
    return 0;
  }
  hs_stats st = HS_STATS_INIT;
  if (hs_result r = hs_stats_get(s, &st); r != HS_OK) return Die("hs_stats_get", r);
  std::printf("OK hits=%llu misses=%llu checked=%llu arena=%s\n", static_cast<unsigned long long>(st.hits),
              static_cast<unsigned long long>(st.misses), static_cast<unsigned long long>(checked),
              KindName(info.arena_kind));
  hs_session_close(s);
  return 0;
}
