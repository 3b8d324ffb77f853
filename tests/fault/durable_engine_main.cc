// hisparse-durable-engine: the engine process of the durable-request test (durable_restart_test),
// C ABI only, host backend. It decodes request 7 step by step (append the step's token to every
// layer, then RESOLVE every layer) and writes one line per (step, layer):
//   STEP LAYER SLOT... HASH EXACT
// the RESOLVE output (a slot per selected position), an FNV-1a hash of the records gathered from
// those slots, and 1 when each equals the record the engine stored at its position.
//   hisparse-durable-engine ADDRESS OUT run STEPS [--die-at K] [--park-at K] [--lease S]
//       admits request 7 durable (lease S, default 60), stores the prompt, decodes STEPS steps;
//       --die-at K: SIGKILLs itself in step K after its appends, before its RESOLVEs (mid-decode);
//       --park-at K: parks and resumes the request before step K (what an adoption does to its row);
//       --hold-at K: before step K, writes OUT.held and waits (for the test to kill the daemon);
//       --plain: admits request 8 too, not durable, and stores its prompt (a daemon's restart loses it);
//       --ride-through-at K: before step K, writes OUT.held and waits for its session to end (the
//       test kills or upgrades the daemon), then rides through: checks that RESOLVE is refused,
//       recovers the session (hs_session_recover), writes what it kept and lost to OUT.ride, and
//       decodes on in the new session from step K.
//   --backend cuda (any mode, CUDA builds): the CUDA backend on GPU 0, every data-path argument in
//   device memory and the slot arena read back from the GPU; the lines are the same.
//   hisparse-durable-engine ADDRESS OUT adopt STEPS FROM
//       adopts the request from the ended session of the same engine name, resumes it, decodes
//       steps FROM..STEPS-1, releases it.
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "hisparse/hisparse.h"

#ifdef HISPARSE_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace {

constexpr uint64_t kRequest = 7;
constexpr uint32_t kLayers = 2;
constexpr uint32_t kRecordBytes = 64;
constexpr uint32_t kK = 4;
constexpr uint32_t kSlots = 8;
constexpr int32_t kPrompt = 40;

void Record(uint32_t layer, int32_t position, uint8_t* out) {
  for (uint32_t i = 0; i < kRecordBytes; ++i) {
    out[i] = static_cast<uint8_t>((position * 131 + layer * 17 + i * 7 + 3) ^ (position >> 8));
  }
}

// The step's selection: the newest position and kK - 1 others from [0, seq_len - 1), unique.
std::vector<int32_t> Select(int step, uint32_t layer, int32_t seq_len) {
  std::vector<int32_t> picked = {seq_len - 1};
  uint64_t x = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(step * 31 + layer + 1);
  while (picked.size() < kK) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const int32_t p = static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(seq_len - 1));
    bool seen = false;
    for (int32_t q : picked) seen = seen || q == p;
    if (!seen) picked.push_back(p);
  }
  return picked;
}

int Fail(const char* what) {
  fprintf(stderr, "%s: %s\n", what, hs_last_error());
  return 1;
}

// --ride-through-at: waits (bounded: 60 s) until the daemon ended the session, then recovers it.
// OUT.ride gets "refused R" (R: hs_resolve's result on the old row once the session ended), a
// "kept ID ROW CAPACITY" line per kept request and a "lost ID STORE" line per lost one (STORE: what
// hs_store into it now returns). Returns the durable request's new row, or -1.
int32_t RideThrough(hs_session* s, hs_session_info* info, int32_t row, const std::string& out_path) {
  const void* arena_before = info->slot_base;
  void* record_before = nullptr;  // where this process maps the request's first record
  if (hs_record_ptr(s, kRequest, 0, 0, &record_before) != HS_OK) return Fail("record ptr"), -1;
  FILE* f = fopen((out_path + ".held").c_str(), "w");
  if (f != nullptr) fclose(f);
  hs_session_state state = HS_SESSION_LIVE;
  for (int i = 0; i < 6000 && state == HS_SESSION_LIVE; ++i) {
    if (hs_session_get_state(s, &state) != HS_OK) return Fail("state"), -1;
    if (state == HS_SESSION_LIVE) usleep(10000);
  }
  if (state != HS_SESSION_ENDED) return fprintf(stderr, "the session never ended\n"), -1;
  FILE* ride = fopen((out_path + ".ride").c_str(), "w");
  if (ride == nullptr) return -1;
  // The old row's state is unknown now: RESOLVE must refuse it (host memory: the host backend's).
  const int32_t seq_len = kPrompt, position = 0;
  int32_t slot = -1;
  hs_resolve_args a = HS_RESOLVE_ARGS_INIT;
  a.max_batch = 1;
  a.rows = &row;
  a.seq_lens = &seq_len;
  a.positions = &position;
  a.out_slots = &slot;
  fprintf(ride, "refused %s\n", hs_result_string(hs_resolve(s, &a)));
  hs_recovery rec = HS_RECOVERY_INIT;
  if (hs_session_recover(s, 30000, &rec) != HS_OK) return Fail("recover"), -1;
  std::vector<hs_recovered_request> kept(rec.kept + 1);
  std::vector<uint64_t> lost(rec.lost + 1);
  size_t nk = 0, nl = 0;
  if (hs_recovery_kept(s, kept.data(), kept.size(), &nk) != HS_OK ||
      hs_recovery_lost(s, lost.data(), lost.size(), &nl) != HS_OK || hs_session_get_info(s, info) != HS_OK) {
    return Fail("recovery report"), -1;
  }
  int32_t new_row = -1;
  for (size_t i = 0; i < nk; ++i) {
    fprintf(ride, "kept %llu %d %u\n", static_cast<unsigned long long>(kept[i].request_id), kept[i].row,
            kept[i].capacity_tokens);
    if (kept[i].request_id == kRequest) new_row = kept[i].row;
  }
  std::vector<uint8_t> rec_bytes(kRecordBytes);
  Record(0, 0, rec_bytes.data());
  for (size_t i = 0; i < nl; ++i) {
    const hs_result stored = hs_store(s, lost[i], 0, 1, 1, rec_bytes.data(), kRecordBytes, kRecordBytes, nullptr);
    fprintf(ride, "lost %llu %s\n", static_cast<unsigned long long>(lost[i]), hs_result_string(stored));
  }
  fprintf(ride, "sessions %llu %llu\n", static_cast<unsigned long long>(rec.old_session_id),
          static_cast<unsigned long long>(rec.new_session_id));
  fprintf(ride, "arena %s %s\n", rec.arena_moved ? "moved" : "kept",
          info->slot_base == arena_before ? "same" : "other");
  // The slab's mapping (and CUDA registration) taken over, not made again: the same address.
  void* record_after = nullptr;
  if (hs_record_ptr(s, kRequest, 0, 0, &record_after) != HS_OK) return Fail("record ptr"), -1;
  fprintf(ride, "records %s\n", record_after == record_before ? "same" : "other");
  fclose(ride);
  return new_row;
}

// Where the data path's arguments live: this process's memory on the host backend, the GPU's on
// the CUDA backend (hisparse.h: "Pointers are device pointers on the CUDA backend").
struct Memory {
  bool cuda = false;
  std::vector<void*> owned;
  // `bytes` holding a copy of `src`, valid until Clear.
  void* Put(const void* src, size_t bytes) {
#ifdef HISPARSE_HAVE_CUDA
    if (cuda) {
      void* d = nullptr;
      if (cudaMalloc(&d, bytes) != cudaSuccess || cudaMemcpy(d, src, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
        fprintf(stderr, "cuda copy failed\n");
        exit(1);
      }
      owned.push_back(d);
      return d;
    }
#endif
    void* h = malloc(bytes);
    memcpy(h, src, bytes);
    owned.push_back(h);
    return h;
  }
  // `bytes` of `src` (a pointer Put made, or into the slot arena) into `dst`, after the stream's work.
  void Get(void* dst, const void* src, size_t bytes) const {
#ifdef HISPARSE_HAVE_CUDA
    if (cuda) {
      if (cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
        fprintf(stderr, "cuda read failed\n");
        exit(1);
      }
      return;
    }
#endif
    memcpy(dst, src, bytes);
  }
  void Sync() const {
#ifdef HISPARSE_HAVE_CUDA
    if (cuda) cudaDeviceSynchronize();
#endif
  }
  void Clear() {
    for (void* p : owned) {
#ifdef HISPARSE_HAVE_CUDA
      if (cuda) {
        cudaFree(p);
        continue;
      }
#endif
      free(p);
    }
    owned.clear();
  }
};

// One decode step: append to every layer, then RESOLVE every layer and write its line.
int Step(hs_session* s, const hs_session_info& info, int32_t row, int step, int die_at, Memory& mem, FILE* out) {
  const int32_t seq_len = kPrompt + step + 1;
  std::vector<uint8_t> rec(kRecordBytes);
  const auto* row_p = static_cast<const int32_t*>(mem.Put(&row, sizeof(row)));
  const auto* seq_p = static_cast<const int32_t*>(mem.Put(&seq_len, sizeof(seq_len)));
  for (uint32_t l = 0; l < kLayers; ++l) {
    Record(l, seq_len - 1, rec.data());
    if (hs_append(s, l, 1, nullptr, row_p, seq_p, mem.Put(rec.data(), kRecordBytes), kRecordBytes, nullptr) != HS_OK) {
      return Fail("append");
    }
  }
  mem.Sync();  // the appends have reached the host pool
  if (step == die_at) raise(SIGKILL);
  for (uint32_t l = 0; l < kLayers; ++l) {
    const std::vector<int32_t> positions = Select(step, l, seq_len);
    std::vector<int32_t> slots(kK, -1);
    auto* slots_p = static_cast<int32_t*>(mem.Put(slots.data(), slots.size() * sizeof(int32_t)));
    hs_resolve_args a = HS_RESOLVE_ARGS_INIT;
    a.layer = l;
    a.max_batch = 1;
    a.rows = row_p;
    a.seq_lens = seq_p;
    a.positions = static_cast<const int32_t*>(mem.Put(positions.data(), positions.size() * sizeof(int32_t)));
    a.out_slots = slots_p;
    if (hs_resolve(s, &a) != HS_OK || (mem.cuda && hs_check_errors(s) != HS_OK)) return Fail("resolve");
    mem.Get(slots.data(), slots_p, slots.size() * sizeof(int32_t));
    uint64_t hash = 0xcbf29ce484222325ull;
    int exact = 1;
    fprintf(out, "%d %u", step, l);
    for (uint32_t j = 0; j < kK; ++j) {
      std::vector<uint8_t> got(kRecordBytes);
      mem.Get(got.data(),
              static_cast<const uint8_t*>(info.slot_base) +
                  ((static_cast<uint64_t>(row) * kLayers + l) * (kSlots + 1) + slots[j]) * info.record_stride,
              kRecordBytes);
      Record(l, positions[j], rec.data());
      exact = exact && memcmp(got.data(), rec.data(), kRecordBytes) == 0;
      for (uint32_t i = 0; i < kRecordBytes; ++i) hash = (hash ^ got[i]) * 0x100000001b3ull;
      fprintf(out, " %d", slots[j]);
    }
    fprintf(out, " %016llx %d\n", static_cast<unsigned long long>(hash), exact);
  }
  fflush(out);
  mem.Clear();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: hisparse-durable-engine ADDRESS OUT run|adopt STEPS [...]\n");
    return 2;
  }
  const std::string mode = argv[3];
  const int steps = atoi(argv[4]);
  int die_at = -1, park_at = -1, hold_at = -1, ride_at = -1, from = 0;
  bool plain = false;
  Memory mem;
  uint32_t lease = 60;
  for (int i = 5; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--die-at" && i + 1 < argc) die_at = atoi(argv[++i]);
    if (arg == "--park-at" && i + 1 < argc) park_at = atoi(argv[++i]);
    if (arg == "--hold-at" && i + 1 < argc) hold_at = atoi(argv[++i]);
    if (arg == "--ride-through-at" && i + 1 < argc) ride_at = atoi(argv[++i]);
    if (arg == "--plain") plain = true;
    if (arg == "--backend" && i + 1 < argc) mem.cuda = std::string(argv[++i]) == "cuda";
    if (arg == "--lease" && i + 1 < argc) lease = static_cast<uint32_t>(atoi(argv[++i]));
    if (mode == "adopt" && i == 5) from = atoi(argv[i]);
  }
  FILE* out = fopen(argv[2], "w");
  if (out == nullptr) return 1;
  hs_session_options o = HS_SESSION_OPTIONS_INIT;
  o.daemon_address = argv[1];
  o.engine_name = "durable-engine";
  o.num_layers = kLayers;
  o.record_bytes = kRecordBytes;
  o.k = kK;
  o.slots = kSlots;
  o.max_requests = 2;
  o.backend = mem.cuda ? HS_BACKEND_CUDA : HS_BACKEND_HOST;
  o.gpu = mem.cuda ? 0 : -1;
  hs_session* s = nullptr;
  if (hs_session_open(&o, &s) != HS_OK) return Fail("open");
  hs_session_info info = HS_SESSION_INFO_INIT;
  if (hs_session_get_info(s, &info) != HS_OK) return Fail("info");
  hs_request_info ri = HS_REQUEST_INFO_INIT;
  if (mode == "run") {
    if (hs_admit_durable(s, kRequest, kPrompt, kPrompt + steps, lease, &ri) != HS_OK) return Fail("admit");
    std::vector<uint8_t> prompt(static_cast<size_t>(kLayers) * kPrompt * kRecordBytes);
    for (uint32_t l = 0; l < kLayers; ++l) {
      for (int32_t p = 0; p < kPrompt; ++p) Record(l, p, &prompt[(l * kPrompt + p) * kRecordBytes]);
    }
    const void* prompt_p = mem.Put(prompt.data(), prompt.size());
    if (hs_store(s, kRequest, 0, kPrompt, kPrompt, prompt_p, int64_t{kPrompt} * kRecordBytes, kRecordBytes, nullptr) !=
            HS_OK ||
        (mem.cuda && hs_check_errors(s) != HS_OK)) {
      return Fail("store");
    }
    hs_request_info plain_info = HS_REQUEST_INFO_INIT;
    if (plain && (hs_admit(s, kRequest + 1, kPrompt, kPrompt + steps, &plain_info) != HS_OK ||
                  hs_store(s, kRequest + 1, 0, kPrompt, kPrompt, prompt_p, int64_t{kPrompt} * kRecordBytes,
                           kRecordBytes, nullptr) != HS_OK ||
                  (mem.cuda && hs_check_errors(s) != HS_OK))) {
      return Fail("admit and store the plain request");
    }
  } else if (mode == "adopt") {
    uint64_t dead = 0, id = 0;
    size_t n = 0;
    if (hs_list_adoptable(s, &dead, &id, nullptr, 1, &n) != HS_OK || n != 1 || id != kRequest) {
      return Fail("list adoptable (want exactly request 7)");
    }
    uint64_t adopted = 0;
    if (hs_adopt(s, dead, &adopted, 1, &n) != HS_OK || n != 1 || adopted != kRequest) return Fail("adopt");
    if (hs_resume(s, kRequest, &ri) != HS_OK) return Fail("resume");
  } else {
    fprintf(stderr, "unknown mode %s\n", mode.c_str());
    return 2;
  }
  int32_t row = static_cast<int32_t>(ri.row);
  for (int step = from; step < steps; ++step) {
    if (step == hold_at) {
      const std::string held = std::string(argv[2]) + ".held";
      FILE* f = fopen(held.c_str(), "w");
      if (f != nullptr) fclose(f);
      for (;;) pause();  // until the test kills it
    }
    if (step == ride_at) {
      fflush(out);
      row = RideThrough(s, &info, row, argv[2]);
      if (row < 0) return 1;
    }
    if (step == park_at) {
      if (hs_park(s, kRequest) != HS_OK || hs_resume(s, kRequest, &ri) != HS_OK) return Fail("park and resume");
      row = static_cast<int32_t>(ri.row);
    }
    if (Step(s, info, row, step, die_at, mem, out) != 0) return 1;
  }
  if (hs_release(s, kRequest) != HS_OK) return Fail("release");
  hs_session_close(s);
  fclose(out);
  return 0;
}
