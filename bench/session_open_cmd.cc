// hisparse-bench session-open: where opening a GPU session's memory goes. Starts its own hisparsed
// (--device cuda, beside this binary or $HISPARSE_DAEMON_BIN) per gpu.arena_export mode and prints
// one JSON object per line:
//   {"kind":"arena", mode, arena_bytes, repeat, phases...}: one session open with a slot arena of
//     about --arena-gib GiB each: the daemon's allocate + clear + export (ArenaInfo.create_seconds),
//     the OpenSession round trip around it, the CUDA backend's setup, the fd-channel fetch, the
//     import (cuMemImportFromShareableHandle / cuIpcOpenMemHandle), the VMM map + set access, and
//     the open end to end; then the close (engine unmap + daemon free) until the GPU's free memory
//     is back. Repeat -1 is each daemon's first arena, which also pays for its CUDA context.
//   {"kind":"host_pool", pool_bytes, segments, ...}: a daemon with a --pool-gib GiB pool of
//     --segment-gib GiB memfd segments (pre-faulted at its start, timed as daemon_start_s); one
//     session admits one request per segment, each holding a whole segment, so every segment is
//     fetched, mmap'ed and cudaHostRegister'ed (mapped, portable): the sums of each phase.
// Everything through the C ABI (hisparse.hpp): the phase times are hs_session_get_timings'.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench_cmd.h"
#include "cuda_bench_util.h"
#include "hisparse/common/daemon_process.h"
#include "hisparse/hisparse.hpp"
#include "hisparse/kernels/arena_layout.h"

namespace hisparse::bench {
namespace {

struct Options {
  std::vector<std::string> modes{"vmm", "cuda_ipc"};
  std::vector<double> arena_gib{1, 16};
  int repeats = 3;
  double pool_gib = 64;  // 0: skip the host-pool part
  double segment_gib = 1;
  int gpu = 0;
};

void Usage() {
  std::fprintf(stderr,
               "usage: hisparse-bench session-open [--modes vmm,cuda_ipc] [--arena-gib 1,16] [--repeats 3]\n"
               "       [--pool-gib 64] [--segment-gib 1] [--gpu 0] [--smoke]\n"
               "  --pool-gib 0 skips the host-pool part. --smoke: 64 MiB arenas once per mode and a 256 MiB pool of\n"
               "  64 MiB slabs (what ctest runs); exits 77 without a GPU.\n");
}

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A geometry whose arena is about `bytes`: 8 layers, B = k = 2048, 656-byte records (DeepSeek
// V3.2's MLA record), as many rows as fit.
hs_session_options GeometryFor(double bytes, int gpu, const char* address) {
  hs_session_options o = HS_SESSION_OPTIONS_INIT;
  o.daemon_address = address;
  o.engine_name = "bench-session-open";
  o.gpu = gpu;
  o.num_layers = 8;
  o.record_bytes = 656;
  o.k = 2048;
  o.slots = 2048;
  o.backend = HS_BACKEND_CUDA;
  const ArenaGeometry one{1, 8, 2048, 2048, 656};
  const double per_row = static_cast<double>(ComputeArenaOffsets(one).total_bytes);
  o.max_requests = static_cast<uint32_t>(std::max(1.0, bytes / per_row));
  return o;
}

size_t FreeGpuBytes() {
  size_t free_b = 0, total = 0;
  cudaMemGetInfo(&free_b, &total);
  return free_b;
}

int ArenaPart(const Options& o) {
  for (const std::string& mode : o.modes) {
    auto d = DaemonProcess::Start({"--device", "cuda", "--gpu-arena-export", mode, "--host-pool-size", "64MiB",
                                   "--host-pool-segment-size", "16MiB", "--log-level", "warning"},
                                  120000);
    if (!d.ok()) {
      std::fprintf(stderr, "hisparse-bench session-open: cannot start hisparsed (%s): %s\n", mode.c_str(),
                   d.status().ToString().c_str());
      return 1;
    }
    // Repeat -1 is the daemon's first GPU arena, which also creates its CUDA context ("cold"); its
    // memory-back time is not measured (the daemon's context stays).
    std::vector<std::pair<double, int>> runs{{o.arena_gib.front(), -1}};
    for (double gib : o.arena_gib) {
      for (int rep = 0; rep < o.repeats; ++rep) runs.emplace_back(gib, rep);
    }
    for (const auto& [gib, rep] : runs) {
      {
        const std::string address = (*d)->address();
        hs_session_options opts = GeometryFor(gib * (1 << 30), o.gpu, address.c_str());
        const size_t free_before = FreeGpuBytes();
        Session s;
        if (Error e = Session::Open(opts, &s)) {
          std::fprintf(stderr, "hisparse-bench session-open: %s, %.0f GiB: %s: %s\n", mode.c_str(), gib,
                       hs_result_string(e.code), e.message.c_str());
          return 1;
        }
        hs_session_timings p;
        hs_session_info info;
        if (Error e = s.Timings(&p); e || (e = s.Info(&info))) {
          std::fprintf(stderr, "hisparse-bench session-open: %s\n", e.message.c_str());
          return 1;
        }
        const std::string kind = ArenaKindName(info.arena_kind);
        const auto t_close = std::chrono::steady_clock::now();
        s.Close();
        double close_s = Since(t_close);
        // The daemon frees on session end, which it learns from the stream: wait for the memory.
        double freed_s = -1;
        if (rep >= 0) {
          while (FreeGpuBytes() + (size_t{64} << 20) < free_before && Since(t_close) < 10) {
          }
          freed_s = Since(t_close);
        }
        std::printf(
            "{\"kind\":\"arena\",\"mode\":\"%s\",\"arena_kind\":\"%s\",\"arena_gib\":%g,\"arena_bytes\":%llu,"
            "\"rows\":%u,\"repeat\":%d,\"daemon_create_s\":%.6f,\"open_rpc_s\":%.6f,\"backend_init_s\":%.6f,"
            "\"fetch_arena_s\":%.6f,\"import_s\":%.6f,\"map_s\":%.6f,\"attach_s\":%.6f,\"open_total_s\":%.6f,"
            "\"close_s\":%.6f,\"gpu_memory_back_s\":%.6f}\n",
            mode.c_str(), kind.c_str(), gib, static_cast<unsigned long long>(info.arena_bytes), opts.max_requests, rep,
            p.daemon_create_s, p.open_rpc_s, p.backend_init_s, p.fetch_arena_s, p.import_s, p.map_s, p.attach_s,
            p.open_total_s, close_s, freed_s);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

int PoolPart(const Options& o) {
  const uint64_t seg = static_cast<uint64_t>(o.segment_gib * (1 << 30));
  const uint64_t pool = static_cast<uint64_t>(o.pool_gib * (1 << 30));
  const auto t0 = std::chrono::steady_clock::now();
  auto d =
      DaemonProcess::Start({"--device", "cuda", "--host-pool-size", std::to_string(pool >> 20) + "MiB",
                            "--host-pool-segment-size", std::to_string(seg >> 20) + "MiB", "--log-level", "warning"},
                           300000);
  if (!d.ok()) {
    std::fprintf(stderr, "hisparse-bench session-open: cannot start hisparsed with a %.0f GiB pool: %s\n", o.pool_gib,
                 d.status().ToString().c_str());
    return 1;
  }
  const double daemon_start_s = Since(t0);
  const std::string address = (*d)->address();
  const uint32_t segments = static_cast<uint32_t>(pool / seg);
  hs_session_options opts = HS_SESSION_OPTIONS_INIT;
  opts.daemon_address = address.c_str();
  opts.engine_name = "bench-session-open-pool";
  opts.gpu = o.gpu;
  opts.num_layers = 1;
  opts.record_bytes = 16384;
  opts.k = 1;
  opts.slots = 1;
  opts.max_requests = segments;
  opts.backend = HS_BACKEND_CUDA;
  Session s;
  if (Error e = Session::Open(opts, &s)) {
    std::fprintf(stderr, "hisparse-bench session-open: pool session: %s\n", e.message.c_str());
    return 1;
  }
  const uint32_t tokens = static_cast<uint32_t>(seg / opts.record_bytes);  // a whole segment
  const auto t1 = std::chrono::steady_clock::now();
  uint32_t admitted = 0;
  for (uint32_t i = 0; i < segments; ++i) {
    if (Error e = s.Admit(i + 1, tokens, tokens)) {
      std::fprintf(stderr, "hisparse-bench session-open: admit %u of %u: %s\n", i + 1, segments, e.message.c_str());
      break;
    }
    ++admitted;
  }
  const double admit_s = Since(t1);
  hs_session_timings h;
  if (Error e = s.Timings(&h)) {
    std::fprintf(stderr, "hisparse-bench session-open: timings: %s\n", e.message.c_str());
    return 1;
  }
  std::printf(
      "{\"kind\":\"host_pool\",\"pool_bytes\":%llu,\"segment_bytes\":%llu,\"segments\":%u,\"admitted\":%u,"
      "\"mapped_segments\":%u,\"mapped_bytes\":%llu,\"daemon_start_s\":%.3f,\"fetch_s\":%.6f,\"mmap_s\":%.6f,"
      "\"register_s\":%.6f,\"register_s_per_gib\":%.6f,\"admit_total_s\":%.6f}\n",
      static_cast<unsigned long long>(pool), static_cast<unsigned long long>(seg), segments, admitted, h.slabs_mapped,
      static_cast<unsigned long long>(h.slab_bytes_mapped), daemon_start_s, h.slab_fetch_s, h.slab_mmap_s,
      h.slab_register_s,
      h.slab_bytes_mapped ? h.slab_register_s / (static_cast<double>(h.slab_bytes_mapped) / (1 << 30)) : 0.0, admit_s);
  std::fflush(stdout);
  const auto t2 = std::chrono::steady_clock::now();
  s.Close();
  std::printf("{\"kind\":\"host_pool_close\",\"close_s\":%.6f}\n", Since(t2));
  return admitted == segments ? 0 : 1;
}

template <typename T>
bool ParseList(const char* text, std::vector<T>* out) {
  out->clear();
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    if constexpr (std::is_same_v<T, std::string>) {
      out->emplace_back(part);
    } else {
      double v = 0;
      if (!absl::SimpleAtod(part, &v)) return false;
      out->push_back(static_cast<T>(v));
    }
  }
  return !out->empty();
}

}  // namespace

int SessionOpenMain(int argc, char** argv) {
  Options o;
  bool smoke = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      Usage();
      return 0;
    }
    if (a == "--smoke") {
      smoke = true;
      continue;
    }
    if (i + 1 >= argc) {
      Usage();
      return 2;
    }
    const char* v = argv[++i];
    bool ok = true;
    if (a == "--modes") {
      ok = ParseList(v, &o.modes);
    } else if (a == "--arena-gib") {
      ok = ParseList(v, &o.arena_gib);
    } else if (a == "--repeats") {
      ok = absl::SimpleAtoi(v, &o.repeats) && o.repeats >= 1;
    } else if (a == "--pool-gib") {
      ok = absl::SimpleAtod(v, &o.pool_gib) && o.pool_gib >= 0;
    } else if (a == "--segment-gib") {
      ok = absl::SimpleAtod(v, &o.segment_gib) && o.segment_gib > 0;
    } else if (a == "--gpu") {
      ok = absl::SimpleAtoi(v, &o.gpu);
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "hisparse-bench session-open: bad argument %s %s\n", a.c_str(), v);
      Usage();
      return 2;
    }
  }
  if (smoke) {
    o.arena_gib = {1.0 / 16};
    o.repeats = 1;
    o.pool_gib = 0.25;
    o.segment_gib = 1.0 / 16;
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count <= o.gpu) {
    std::fprintf(stderr, "hisparse-bench session-open: no CUDA device %d%s\n", o.gpu, smoke ? " (smoke: skipped)" : "");
    return smoke ? 77 : 1;
  }
  // This process's own CUDA context first, so that it is in no measured phase or memory baseline.
  BENCH_CUDA(cudaSetDevice(o.gpu));
  BENCH_CUDA(cudaFree(nullptr));
  if (int rc = ArenaPart(o); rc != 0) return rc;
  if (o.pool_gib > 0) return PoolPart(o);
  return 0;
}

}  // namespace hisparse::bench
