// hisparse-import-worker's channel loop and grant mappings: see worker.h.
#include "import_worker/worker.h"

#include <linux/magic.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "hisparse/common/import_channel.h"
#include "hisparse/common/log.h"
#include "hisparse/common/status_macros.h"
#include "hisparse/common/unique_fd.h"
#include "hisparse/common/unix_socket.h"
#include "import_worker/ucx_import.h"

namespace hisparse {
namespace {

// Bounds on what the daemon may stage for one grant (it is trusted; these catch a bug, not an
// attack): 2^20 slabs, 2^26 pages.
constexpr size_t kMaxStagedSlabs = size_t{1} << 20;
constexpr size_t kMaxStagedPages = size_t{1} << 26;

struct StagedSlab {
  UniqueFd fd;
  uint64_t bytes = 0;
  uint64_t granule = 4096;  // what a mapping's offset must be a multiple of (the huge page size on hugetlbfs)
};

// One grant's mappings: for each slab, the runs of granted pages, rounded out to the slab's
// granule and merged. Unmapped when destroyed.
struct GrantMappings {
  std::vector<MappedRegion> regions;
};

absl::StatusOr<StagedSlab> StageSlab(UniqueFd fd, uint64_t bytes) {
  if (!fd.valid()) return absl::InvalidArgumentError("a slab message came without its descriptor");
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "fstat of a granted slab");
  if (static_cast<uint64_t>(st.st_size) != bytes) {
    return absl::InvalidArgumentError(absl::StrCat("a granted slab holds ", st.st_size, " bytes, not ", bytes));
  }
  StagedSlab s{std::move(fd), bytes, 4096};
  struct statfs fs {};
  if (::fstatfs(s.fd.get(), &fs) == 0 && fs.f_type == HUGETLBFS_MAGIC) s.granule = static_cast<uint64_t>(fs.f_bsize);
  return s;
}

// Maps the granted pages and fills `pages` with the worker's address of each.
absl::Status MapGrant(const std::vector<StagedSlab>& slabs, const std::vector<ChannelPageRef>& refs,
                      const ChannelRegister& reg, UcxImport::Grant* grant, GrantMappings* mappings) {
  const uint64_t per_layer = ImportPagesPerLayer(reg.layout);
  if (reg.page_bytes == 0 || per_layer == 0 || refs.size() != per_layer * reg.layout.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("a grant's page table holds ", refs.size(), " pages, not ",
                                                   per_layer, " for each of ", reg.layout.num_layers, " layers"));
  }
  // Per slab: [start, end) ranges of whole granules around each page, merged.
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> ranges(slabs.size());
  for (const ChannelPageRef& r : refs) {
    if (r.slab >= slabs.size()) return absl::InvalidArgumentError("a page names a slab the grant did not send");
    const StagedSlab& s = slabs[r.slab];
    if (r.offset > s.bytes || s.bytes - r.offset < reg.page_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("a page at ", r.offset, " lies outside its ", s.bytes, "-byte slab"));
    }
    const uint64_t start = r.offset / s.granule * s.granule;
    const uint64_t end = std::min(s.bytes, (r.offset + reg.page_bytes + s.granule - 1) / s.granule * s.granule);
    ranges[r.slab].emplace_back(start, end);
  }
  // slab -> (range start -> mapped address), to find each page's address below.
  std::vector<std::map<uint64_t, std::pair<uint64_t, uint8_t*>>> mapped(slabs.size());
  for (size_t i = 0; i < slabs.size(); ++i) {
    auto& rs = ranges[i];
    std::sort(rs.begin(), rs.end());
    for (size_t k = 0; k < rs.size();) {
      uint64_t start = rs[k].first, end = rs[k].second;
      for (++k; k < rs.size() && rs[k].first <= end; ++k) end = std::max(end, rs[k].second);
      HS_ASSIGN_OR_RETURN(MappedRegion region, MappedRegion::MapShared(slabs[i].fd.get(), end - start, start));
      mapped[i][start] = {end, region.data()};
      mappings->regions.push_back(std::move(region));
    }
  }
  grant->layout = reg.layout;
  grant->page_bytes = reg.page_bytes;
  grant->expires = absl::FromUnixNanos(reg.expires_unix_ns);
  grant->pages.assign(reg.layout.num_layers, {});
  for (size_t k = 0; k < refs.size(); ++k) {
    const ChannelPageRef& r = refs[k];
    auto it = std::prev(mapped[r.slab].upper_bound(r.offset));  // the merged range holding the page
    grant->pages[k / per_layer].push_back(it->second.second + (r.offset - it->first));
  }
  return absl::OkStatus();
}

class Worker {
 public:
  Worker(int channel, std::unique_ptr<UcxImport> ucx) : channel_(channel), ucx_(std::move(ucx)) {}

  // Until the daemon closes the channel (OK) or sends what does not decode.
  absl::Status Serve() {
    for (;;) {
      absl::StatusOr<Packet> p = RecvPacket(channel_, kImportChannelMaxPacket);
      if (absl::IsUnavailable(p.status())) return absl::OkStatus();  // the daemon closed its end
      if (!p.ok()) return p.status();
      absl::StatusOr<ChannelMessage> m = DecodeChannelMessage(p->payload);
      if (!m.ok()) return m.status();
      HS_RETURN_IF_ERROR(Handle(*std::move(m), std::move(p->fd)));
    }
  }

 private:
  absl::Status Handle(ChannelMessage m, UniqueFd fd) {
    if (!std::holds_alternative<ChannelSlab>(m) && fd.valid()) {
      return absl::InvalidArgumentError("a descriptor came with a message that takes none");
    }
    if (auto* slab = std::get_if<ChannelSlab>(&m)) {
      if (slabs_.size() == kMaxStagedSlabs) return absl::InvalidArgumentError("too many slabs staged for one grant");
      HS_ASSIGN_OR_RETURN(StagedSlab s, StageSlab(std::move(fd), slab->bytes));
      slabs_.push_back(std::move(s));
      return absl::OkStatus();
    }
    if (auto* pages = std::get_if<ChannelPages>(&m)) {
      if (refs_.size() + pages->refs.size() > kMaxStagedPages) {
        return absl::InvalidArgumentError("too many pages staged for one grant");
      }
      refs_.insert(refs_.end(), pages->refs.begin(), pages->refs.end());
      return absl::OkStatus();
    }
    if (auto* reg = std::get_if<ChannelRegister>(&m)) return Ack(reg->seq, Register(*reg));
    if (auto* unreg = std::get_if<ChannelUnregister>(&m)) {
      ucx_->Unregister(unreg->grant_id);  // no write lands in its pages after this
      grants_.erase(unreg->grant_id);     // so they are unmapped only now
      return Ack(unreg->seq, absl::OkStatus());
    }
    return absl::InvalidArgumentError("the daemon sent a message only the worker sends");
  }

  absl::Status Register(const ChannelRegister& reg) {
    // What was staged belongs to this grant alone, registered or not.
    std::vector<StagedSlab> slabs = std::exchange(slabs_, {});
    std::vector<ChannelPageRef> refs = std::exchange(refs_, {});
    if (grants_.contains(reg.grant_id)) return absl::AlreadyExistsError("grant registered twice");
    UcxImport::Grant grant;
    auto mappings = std::make_unique<GrantMappings>();
    HS_RETURN_IF_ERROR(MapGrant(slabs, refs, reg, &grant, mappings.get()));
    HS_RETURN_IF_ERROR(ucx_->Register(reg.grant_id, grant));
    grants_.emplace(reg.grant_id, std::move(mappings));
    return absl::OkStatus();
  }

  absl::Status Ack(uint64_t seq, const absl::Status& status) {
    ChannelAck a{seq, status.code(), std::string(status.message())};
    return SendPacket(channel_, EncodeChannelMessage(a), -1);
  }

  const int channel_;
  std::unique_ptr<UcxImport> ucx_;
  std::vector<StagedSlab> slabs_;     // since the last kRegister
  std::vector<ChannelPageRef> refs_;  // since the last kRegister
  absl::flat_hash_map<std::string, std::unique_ptr<GrantMappings>> grants_;
};

// The process's private data now (VmData: what RLIMIT_DATA counts), 0 if unknown.
uint64_t DataBytesNow() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    uint64_t kib = 0;
    // "VmData:    1234 kB"
    if (line.rfind("VmData:", 0) == 0 && line.size() > 10 &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(7, line.size() - 10)), &kib)) {
      return kib << 10;
    }
  }
  return 0;
}

}  // namespace

absl::Status RunImportWorker(const ImportWorkerOptions& options) {
  if (options.memory_limit_bytes != 0) {
    // What the worker may grow by from here (UCX's buffers, the grants' page tables): the limit is
    // its data now plus the budget, so that a sanitizer's reserved shadow does not eat it.
    const uint64_t bytes = DataBytesNow() + options.memory_limit_bytes;
    const rlimit limit{bytes, bytes};
    if (::setrlimit(RLIMIT_DATA, &limit) != 0) return ErrnoStatus(errno, "setrlimit(RLIMIT_DATA)");
  }
  UcxImport::Options o;
  o.ucx_tls = options.ucx_tls;
  o.ucx_net_devices = options.ucx_net_devices;
  HS_ASSIGN_OR_RETURN(std::unique_ptr<UcxImport> ucx, UcxImport::Start(std::move(o)));
  HS_RETURN_IF_ERROR(SendPacket(options.channel_fd,
                                EncodeChannelMessage(ChannelHello{kImportChannelVersion, ucx->WorkerAddress()}), -1));
  Worker worker(options.channel_fd, std::move(ucx));
  return worker.Serve();
}

}  // namespace hisparse
