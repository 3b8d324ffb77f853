// The host-emulated device: arena in host memory (the daemon's memfd, mapped), RESOLVE / store /
// append by the CPU reference, synchronously. What CI and machines without a GPU run.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "device_backend.h"

namespace hisparse {

std::string DescribeResolveErrors(uint32_t bits) {
  std::vector<std::string> what;
  if (bits & kResolveBadPosition) what.push_back("a position outside [-1, seq_len)");
  if (bits & kResolveDuplicate) what.push_back("a position selected twice in one row");
  if (bits & kResolveBadSeqLen) what.push_back("seq_len outside [1, the request's capacity]");
  if (bits & kResolveBadRow) what.push_back("a row outside [-1, max_requests) or not admitted");
  if (bits & kResolveBadIndex) what.push_back("a source index outside [0, src_tokens) of the source pool");
  if (bits & kResolveBadQueryCount) what.push_back("a query or token count outside [1, draft_tokens + 1]");
  if (bits & kResolveUnionTooLarge) what.push_back("the union of a row's query lists larger than slots (B)");
  if (bits & kResolveReadOnlyPage) what.push_back("a write into a read-only (shared) host page");
  return absl::StrCat("invalid data-path input (the state of those rows, or of that store's request, is unchanged): ",
                      absl::StrJoin(what, "; "));
}

absl::Status PrivateGpuArenaAllowed(const char* request) {
  if (request != nullptr && std::string_view(request) == "1") return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "the daemon serves this session a host-memory slot arena (its device is host, or auto where it sees no "
      "GPU; its log says which), which the CUDA backend cannot use in place; a private GPU arena would hide "
      "this session's RESOLVE counters and GPU memory from the daemon. Run the daemon where it sees the GPU "
      "(device: auto or cuda), open the session with gpu = -1 (host backend), or set ",
      kPrivateGpuArenaEnv, "=1 to keep a private GPU arena anyway"));
}

absl::Status CheckHostMapRow(const ArenaGeometry& g, const HostPageGeometry& p, int32_t row,
                             const uint8_t* const* pages, uint32_t pages_given, int32_t capacity) {
  if (row < 0 || row >= g.max_rows) {
    return absl::InvalidArgumentError(absl::StrCat("host map: row ", row, " outside [0, ", g.max_rows, ")"));
  }
  if (capacity < 0) return absl::InvalidArgumentError(absl::StrCat("host map: capacity ", capacity, " < 0"));
  if (capacity == 0) return absl::OkStatus();
  if (pages == nullptr || pages_given < 1 || pages_given > p.pages_per_entry) {
    return absl::InvalidArgumentError(absl::StrCat("host map: row ", row, " given ", pages_given,
                                                   " pages per layer (null or outside [1, ", p.pages_per_entry, "])"));
  }
  const uint64_t needed = (static_cast<uint64_t>(capacity) + p.records_per_page - 1) / p.records_per_page;
  if (needed > pages_given) {
    return absl::InvalidArgumentError(absl::StrCat("host map: capacity ", capacity, " needs ", needed, " pages of ",
                                                   p.records_per_page, " records per layer, ", pages_given, " given"));
  }
  for (int32_t l = 0; l < g.num_layers; ++l) {
    for (uint32_t i = 0; i < pages_given; ++i) {
      const uint8_t* page = pages[static_cast<size_t>(l) * pages_given + i];
      if (page == nullptr && i < needed) {
        return absl::InvalidArgumentError(absl::StrCat("host map: row ", row, " layer ", l, " page ", i,
                                                       " is null but holds positions below the capacity"));
      }
      if (reinterpret_cast<uintptr_t>(HostRecordMap::PageAddress(page)) % kRecordAlign != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("host map: row ", row, " layer ", l, " page ", i, " is not 16-byte aligned"));
      }
    }
  }
  return absl::OkStatus();
}

void FillHostMapRow(const ArenaGeometry& g, const HostPageGeometry& p, int32_t row, const uint8_t* const* pages,
                    uint32_t pages_given, int32_t capacity, uint8_t** table) {
  const size_t ppe = p.pages_per_entry;
  for (int32_t l = 0; l < g.num_layers; ++l) {
    uint8_t** t = table + (static_cast<size_t>(row) * g.num_layers + l) * ppe;
    for (size_t i = 0; i < ppe; ++i) {
      const bool given = capacity > 0 && i < pages_given;
      t[i] = given ? const_cast<uint8_t*>(pages[static_cast<size_t>(l) * pages_given + i]) : nullptr;
    }
  }
}

namespace {

class HostBackend final : public DeviceBackend {
 public:
  HostBackend(const ArenaGeometry& g, const HostPageGeometry& p)
      : geometry_(g),
        pages_(p),
        page_base_(static_cast<size_t>(g.max_rows) * g.num_layers * p.pages_per_entry, nullptr),
        capacity_(g.max_rows, 0) {}

  hs_backend kind() const override { return HS_BACKEND_HOST; }
  absl::StatusOr<uint8_t*> RegisterHostSegment(uint8_t* host, size_t) override { return host; }
  void UnregisterHostSegment(uint8_t*) override {}
  absl::StatusOr<ArenaView> Attach(const AttachedArena& arena, const ArenaGeometry& g) override {
    if (arena.form != AttachedArena::Form::kHostMapped) {
      return absl::FailedPreconditionError(
          "the daemon put this session's slot arena in GPU memory (device: auto or cuda on a GPU node); the "
          "host-emulated backend cannot use it: open the session with the CUDA backend, or with gpu = -1");
    }
    ArenaView v = ArenaView::Of(arena.mapped, g);
    counters_ = v.counters;
    return v;
  }
  HostRecordMap host_map() const override {
    return HostRecordMap{page_base_.data(), capacity_.data(), pages_.records_per_page, pages_.pages_per_entry};
  }
  absl::Status SetHostMapRow(int32_t row, const uint8_t* const* pages, uint32_t pages_given,
                             int32_t capacity) override {
    if (absl::Status st = CheckHostMapRow(geometry_, pages_, row, pages, pages_given, capacity); !st.ok()) return st;
    FillHostMapRow(geometry_, pages_, row, pages, pages_given, capacity, page_base_.data());
    capacity_[row] = capacity;
    return absl::OkStatus();
  }
  absl::Status ResetRow(const ArenaView& arena, int32_t row, void*) override {
    ResetRowReference(arena, row);
    return absl::OkStatus();
  }
  absl::Status Resolve(const ResolveDesc& desc, const ResolvePlacement&, void*) override {
    ResolveDesc d = desc;
    const int32_t all = d.max_batch;
    if (d.batch_size == nullptr) d.batch_size = &all;
    return Check(ResolveReference(d));
  }
  absl::Status Store(const StoreDesc& d, void*) override { return Check(StoreReference(d)); }
  absl::Status StoreIndexed(const IndexedStoreDesc& d, void*) override { return Check(IndexedStoreReference(d)); }
  absl::Status Append(const AppendDesc& desc, void*) override {
    AppendDesc d = desc;
    const int32_t all = d.max_batch;
    if (d.batch_size == nullptr) d.batch_size = &all;
    return Check(AppendReference(d));
  }
  absl::StatusOr<MissPlan> AllocMissPlan() override {
    const size_t bytes = MissPlan::Bytes(geometry_, geometry_.max_rows);
    plans_.push_back(std::make_unique<int32_t[]>((bytes + 3) / 4));
    return MissPlan::Of(plans_.back().get(), geometry_.max_rows);
  }
  absl::Status Replay(const ReplayDesc& d, void*) override { return Check(ReplayReference(d)); }
  absl::Status Prewarm(const PrewarmDesc& desc, void*) override {
    PrewarmDesc d = desc;
    const int32_t all = d.max_batch;
    if (d.batch_size == nullptr) d.batch_size = &all;
    return Check(PrewarmReference(d));
  }
  absl::Status CheckErrors() override { return absl::OkStatus(); }  // reported synchronously
  uint32_t* error_flags() override { return nullptr; }
  absl::StatusOr<ArenaCounters> ReadCounters() override {
    if (counters_ == nullptr) return absl::FailedPreconditionError("no arena attached");
    return *counters_;
  }

 private:
  static absl::Status Check(uint32_t bits) {
    return bits == 0 ? absl::OkStatus() : absl::InvalidArgumentError(DescribeResolveErrors(bits));
  }
  const ArenaGeometry geometry_;
  const HostPageGeometry pages_;
  const ArenaCounters* counters_ = nullptr;
  std::vector<std::unique_ptr<int32_t[]>> plans_;  // miss plans of anchor layers
  std::vector<uint8_t*> page_base_;                // [max_rows * layers * pages_per_entry]
  std::vector<int32_t> capacity_;
};

}  // namespace

std::unique_ptr<DeviceBackend> MakeHostBackend(const ArenaGeometry& g, const HostPageGeometry& pages) {
  return std::make_unique<HostBackend>(g, pages);
}

#ifndef HISPARSE_HAVE_CUDA
absl::StatusOr<std::unique_ptr<DeviceBackend>> MakeCudaBackend(int, const ArenaGeometry&, const HostPageGeometry&) {
  return absl::UnimplementedError("this libhisparse was built without CUDA: use the host backend");
}

absl::StatusOr<std::string> CudaGpuUuid(int) {
  return absl::UnimplementedError("this libhisparse was built without CUDA");
}

absl::Status LaunchTopkOn(int, const TopkDesc&, void*) {
  return absl::UnimplementedError("this libhisparse was built without CUDA: pass device -1 and host memory");
}
#endif

}  // namespace hisparse
