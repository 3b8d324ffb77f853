// hisparse-bench import: the prefill side of an import over UCX (docs/DESIGN.md, "Import").
//
//   hisparse-bench import --daemon ADDRESS --grant FILE [--grant FILE ...] [--seed N] [--tls T]
//                         [--records FILE ...] [--hold] [--no-commit]
//     The transfer agent: for each grant (a serialized hisparse.v1.ImportGrant, "-" = stdin),
//     puts the pattern records (import_pattern.h, `seed`) into the grant's pages over UCX,
//     flushes, and commits (CommitImport) unless --no-commit. --records (one per --grant, in
//     order): the grant's records from a file instead, layer by layer, each layer n records in
//     position order (n = size / (layers x record bytes), at most capacity_tokens; the rest
//     zero), as a prefill node would send its KV (examples/engine/vllm_serve_mode.py). --hold: after the flush, print
//     {"written": N} and wait for stdin to close before committing (the kill test's importer).
//   hisparse-bench import --self [--daemon ADDRESS] [--requests 8 --layers 4 --tokens 32768
//                         --record-bytes 64] [--seed N] [--tls T]
//     Engine and agent in one process: opens a session (starting its own hisparsed without
//     --daemon), admits the requests as imports, writes, commits, awaits the commits and checks
//     every record through hs_record_ptr. --smoke: --self at tiny sizes (ctest).
// Both report JSON: bytes written, seconds and GB/s (first write sent to last answer received),
// and the same bytes copied with memcpy into local memory, page chunk by page chunk.
//   hisparse-bench import --daemon ADDRESS --grant FILE --attack KIND [--addr A --bytes N] [--tls T]
//     The misuse tests' tool: one write the daemon must refuse, its answer printed as
//     {"attack": KIND, "code": CODE}. KIND: unknown-grant (a grant id never issued), layer (one past
//     the grant's layers), position (past its positions), size (a record size not the grant's),
//     rndv (a rendezvous message), write (one valid record: refused after expiry or commit), or
//     forged-put (a UCX RMA put of --bytes at daemon address --addr, with a key of this process's
//     own memory; prints {"attack": "forged-put", "ucx": STATUS}).
#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bench_cmd.h"
#include "hisparse/common/daemon_process.h"
#include "hisparse/common/import_pattern.h"
#include "hisparse/common/secret.h"
#include "hisparse/hisparse.h"
#include "hisparse/v1/hisparse.grpc.pb.h"
#include "import_writer.h"

namespace hisparse::bench {
namespace {

struct Config {
  std::string daemon, tls, attack;
  uint64_t addr = 0, bytes = 0;
  std::vector<std::string> grants, records;
  uint64_t seed = 1;
  bool hold = false, commit = true, self = false;
  uint32_t requests = 8, layers = 4, tokens = 32768, record_bytes = 64;
};

int Usage() {
  std::fprintf(stderr,
               "usage: hisparse-bench import --daemon ADDRESS --grant FILE... [--seed N] [--tls T] "
               "[--records FILE...] [--hold] [--no-commit]\n"
               "       hisparse-bench import --self|--smoke [--daemon ADDRESS] [--requests N] [--layers N] "
               "[--tokens N] [--record-bytes N] [--seed N] [--tls T]\n"
               "       hisparse-bench import --daemon ADDRESS --grant FILE --attack "
               "unknown-grant|layer|position|size|rndv|write|forged-put [--addr A --bytes N] [--tls T]\n");
  return 2;
}

int ParseFlags(int argc, char** argv, Config* c) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--hold") {
      c->hold = true;
    } else if (arg == "--no-commit") {
      c->commit = false;
    } else if (arg == "--self") {
      c->self = true;
    } else if (arg == "--smoke") {
      c->self = true, c->requests = 2, c->layers = 2, c->tokens = 1000, c->record_bytes = 48;
    } else {
      std::string name, value;
      if (!TakeFlag(argc, argv, &i, &name, &value)) return Usage();
      bool ok = true;
      if (name == "--daemon") {
        c->daemon = value;
      } else if (name == "--tls") {
        c->tls = value;
      } else if (name == "--attack") {
        c->attack = value;
      } else if (name == "--addr") {
        ok = absl::SimpleHexAtoi(value, &c->addr) || absl::SimpleAtoi(value, &c->addr);
      } else if (name == "--bytes") {
        ok = absl::SimpleAtoi(value, &c->bytes);
      } else if (name == "--grant") {
        c->grants.push_back(value);
      } else if (name == "--records") {
        c->records.push_back(value);
      } else if (name == "--seed") {
        ok = absl::SimpleAtoi(value, &c->seed);
      } else if (name == "--requests") {
        ok = absl::SimpleAtoi(value, &c->requests);
      } else if (name == "--layers") {
        ok = absl::SimpleAtoi(value, &c->layers);
      } else if (name == "--tokens") {
        ok = absl::SimpleAtoi(value, &c->tokens);
      } else if (name == "--record-bytes") {
        ok = absl::SimpleAtoi(value, &c->record_bytes);
      } else {
        ok = false;
      }
      if (!ok) return Usage();
    }
  }
  if (!c->self && (c->daemon.empty() || c->grants.empty())) return Usage();
  if (!c->records.empty() && c->records.size() != c->grants.size()) return Usage();
  return -1;
}

absl::StatusOr<v1::ImportGrant> ReadGrant(const std::string& path) {
  std::string bytes;
  if (path == "-") {
    bytes.assign(std::istreambuf_iterator<char>(std::cin), {});
  } else {
    std::ifstream in(path, std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot read grant file ", path));
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  v1::ImportGrant grant;
  if (!grant.ParseFromString(bytes) || grant.grant_id().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, " does not hold an ImportGrant"));
  }
  return grant;
}

absl::Status Commit(const std::string& daemon, const v1::ImportGrant& grant) {
  auto stub = v1::HiSparse::NewStub(grpc::CreateChannel(daemon, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::CommitImportRequest req;
  req.set_grant_id(grant.grant_id());
  req.set_session_id(grant.session_id());
  req.set_request_id(grant.request_id());
  v1::CommitImportResponse resp;
  grpc::Status s = stub->CommitImport(&ctx, req, &resp);
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), absl::StrCat("commit: ", s.error_message()));
}

// A grant's records from a file (--records): layer by layer, n records each, zero past n.
absl::StatusOr<std::vector<std::vector<uint8_t>>> FileRecords(const v1::ImportGrant& g, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read records file ", path));
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), {});
  const uint64_t per_token = uint64_t{g.num_layers()} * g.record_bytes();
  const uint64_t n = per_token ? bytes.size() / per_token : 0;
  if (per_token == 0 || bytes.size() % per_token != 0 || n > g.capacity_tokens()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", bytes.size(), " bytes are not ", g.num_layers(),
                                                   " layers of at most ", g.capacity_tokens(), " records of ",
                                                   g.record_bytes(), " bytes"));
  }
  const uint64_t layer_bytes = n * g.record_bytes();
  std::vector<std::vector<uint8_t>> layers(g.num_layers());
  for (uint32_t l = 0; l < g.num_layers(); ++l) {
    layers[l].assign(uint64_t{g.capacity_tokens()} * g.record_bytes(), 0);
    std::copy(bytes.begin() + l * layer_bytes, bytes.begin() + (l + 1) * layer_bytes, layers[l].begin());
  }
  return layers;
}

struct Figures {
  uint64_t bytes = 0;
  double put_s = 0, memcpy_s = 0;
  std::string transports;
};

// Writes every grant (pattern `seed`), flushes, and times it against memcpy of the same bytes.
absl::StatusOr<Figures> WriteAll(const Config& c, const std::vector<v1::ImportGrant>& grants) {
  Figures f;
  if (grants.empty()) return f;
  std::vector<std::vector<std::vector<uint8_t>>> records;
  for (size_t i = 0; i < grants.size(); ++i) {
    const v1::ImportGrant& g = grants[i];
    if (c.records.empty()) {
      records.push_back(PatternRecords(g, c.seed));
    } else {
      auto from_file = FileRecords(g, c.records[i]);
      if (!from_file.ok()) return from_file.status();
      records.push_back(*std::move(from_file));
    }
    f.bytes += uint64_t{g.num_layers()} * g.capacity_tokens() * g.record_bytes();
  }
  for (size_t i = 0; i < grants.size(); ++i) f.memcpy_s += MemcpyLikeImport(grants[i], records[i]);
  auto writer = ImportWriter::Connect(grants[0].worker_address(), c.tls);
  if (!writer.ok()) return writer.status();
  f.transports = (*writer)->transports();
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < grants.size(); ++i) {
    if (grants[i].worker_address() != grants[0].worker_address()) {
      return absl::InvalidArgumentError("the grants name different daemons");
    }
    if (absl::Status st = (*writer)->Write(grants[i], records[i]); !st.ok()) return st;
  }
  f.put_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return f;
}

void Report(const Config& c, const Figures& f, const char* mode) {
  (void)c;
  std::printf(
      "{\"mode\": \"%s\", \"tls\": \"%s\", \"uid\": %u, \"bytes\": %llu, \"import_seconds\": %.6f, "
      "\"import_gbps\": %.3f, \"memcpy_seconds\": %.6f, \"memcpy_gbps\": %.3f}\n",
      mode, f.transports.c_str(), static_cast<unsigned>(::geteuid()), static_cast<unsigned long long>(f.bytes), f.put_s,
      f.put_s > 0 ? f.bytes / f.put_s / 1e9 : 0.0, f.memcpy_s, f.memcpy_s > 0 ? f.bytes / f.memcpy_s / 1e9 : 0.0);
}

// --attack: one write (or put) the daemon must refuse; prints what it answered.
int AttackMain(const Config& c) {
  auto grant = ReadGrant(c.grants[0]);
  if (!grant.ok()) {
    std::fprintf(stderr, "hisparse-bench import: %s\n", grant.status().ToString().c_str());
    return 1;
  }
  auto writer = ImportWriter::Connect(grant->worker_address(), c.tls);
  if (!writer.ok()) {
    std::fprintf(stderr, "hisparse-bench import: %s\n", writer.status().ToString().c_str());
    return 1;
  }
  if (c.attack == "forged-put") {
    const absl::Status st = (*writer)->ForgedPut(c.addr, c.bytes == 0 ? 64 : c.bytes);
    std::printf("{\"attack\": \"forged-put\", \"ucx\": \"%s\"}\n", st.ok() ? "completed" : st.ToString().c_str());
    return 0;
  }
  ImportWrite w{grant->grant_id(), 7, 0, 0, 1, grant->record_bytes()};
  bool rndv = false;
  if (c.attack == "unknown-grant") {
    w.grant_id = NewSecret128();
  } else if (c.attack == "layer") {
    w.layer = grant->num_layers();
  } else if (c.attack == "position") {
    w.first = grant->capacity_tokens() - 1, w.count = 2;
  } else if (c.attack == "size") {
    w.record_bytes += 8;
  } else if (c.attack == "rndv") {
    rndv = true;
  } else if (c.attack != "write") {
    return Usage();
  }
  std::vector<uint8_t> payload(uint64_t{w.count} * w.record_bytes, 0xEE);
  absl::StatusOr<ImportCode> code = (*writer)->SendOne(w, payload.data(), payload.size(), rndv);
  if (!code.ok()) {
    std::fprintf(stderr, "hisparse-bench import: %s\n", code.status().ToString().c_str());
    return 1;
  }
  std::printf("{\"attack\": \"%s\", \"code\": \"%s\"}\n", c.attack.c_str(), ImportCodeName(*code));
  return 0;
}

int AgentMain(const Config& c) {
  if (!c.attack.empty()) return AttackMain(c);
  std::vector<v1::ImportGrant> grants;
  for (const std::string& path : c.grants) {
    auto g = ReadGrant(path);
    if (!g.ok()) {
      std::fprintf(stderr, "hisparse-bench import: %s\n", g.status().ToString().c_str());
      return 1;
    }
    grants.push_back(*std::move(g));
  }
  auto figures = WriteAll(c, grants);
  if (!figures.ok()) {
    std::fprintf(stderr, "hisparse-bench import: %s\n", figures.status().ToString().c_str());
    return 1;
  }
  if (c.hold) {
    std::printf("{\"written\": %llu}\n", static_cast<unsigned long long>(figures->bytes));
    std::fflush(stdout);
    char byte;
    while (::read(0, &byte, 1) > 0) {
    }
  }
  for (const v1::ImportGrant& g : grants) {
    if (!c.commit) break;
    if (absl::Status st = Commit(c.daemon, g); !st.ok()) {
      std::fprintf(stderr, "hisparse-bench import: request %llu: %s\n", static_cast<unsigned long long>(g.request_id()),
                   st.ToString().c_str());
      return 1;
    }
  }
  Report(c, *figures, "agent");
  return 0;
}

// The engine's side of --self: admit, hand out grants, await commits, check every record.
int SelfMain(const Config& c) {
  std::unique_ptr<DaemonProcess> own;
  std::string address = c.daemon;
  if (address.empty()) {
    const uint64_t need = uint64_t{c.requests} * c.layers * c.tokens * c.record_bytes;
    const std::string pool = absl::StrCat((need * 5 / 4 >> 20) + 64, "MiB");
    auto d = DaemonProcess::Start({"--host-pool-size", pool, "--host-pool-page-size", "64KiB", "--host-pool-slab-size",
                                   "16MiB", "--log-level", "warning"},
                                  120000);
    if (!d.ok()) {
      std::fprintf(stderr, "hisparse-bench import: cannot start hisparsed: %s\n", d.status().ToString().c_str());
      return 1;
    }
    own = std::move(*d);
    address = own->address();
  }
  hs_session_options o = HS_SESSION_OPTIONS_INIT;
  o.daemon_address = address.c_str();
  o.engine_name = "bench-import";
  o.num_layers = c.layers;
  o.record_bytes = c.record_bytes;
  o.k = 8;
  o.slots = 16;
  o.max_requests = c.requests;
  o.backend = HS_BACKEND_HOST;
  hs_session* s = nullptr;
  auto fail = [&](const char* what, hs_result r) {
    std::fprintf(stderr, "hisparse-bench import: %s: %s: %s\n", what, hs_result_string(r), hs_last_error());
    if (s != nullptr) hs_session_close(s);
    return 1;
  };
  if (hs_result r = hs_session_open(&o, &s); r != HS_OK) return fail("open", r);
  std::vector<v1::ImportGrant> grants;
  for (uint32_t i = 0; i < c.requests; ++i) {
    if (hs_result r = hs_admit_import(s, i + 1, c.tokens, c.tokens); r != HS_OK) return fail("admit import", r);
    size_t n = 0;
    (void)hs_import_grant(s, i + 1, nullptr, 0, &n);
    std::string bytes(n, '\0');
    if (hs_result r = hs_import_grant(s, i + 1, bytes.data(), n, &n); r != HS_OK) return fail("grant", r);
    grants.emplace_back().ParseFromString(bytes);
  }
  auto figures = WriteAll(c, grants);
  if (!figures.ok()) {
    std::fprintf(stderr, "hisparse-bench import: %s\n", figures.status().ToString().c_str());
    hs_session_close(s);
    return 1;
  }
  for (const v1::ImportGrant& g : grants) {
    if (absl::Status st = Commit(address, g); !st.ok()) {
      std::fprintf(stderr, "hisparse-bench import: %s\n", st.ToString().c_str());
      hs_session_close(s);
      return 1;
    }
  }
  std::vector<uint8_t> want(c.record_bytes);
  for (uint32_t i = 0; i < c.requests; ++i) {
    hs_request_info info = HS_REQUEST_INFO_INIT;
    if (hs_result r = hs_await_import(s, i + 1, 30000, &info); r != HS_OK) return fail("await import", r);
    for (uint32_t l = 0; l < c.layers; ++l) {
      for (uint32_t p = 0; p < c.tokens; ++p) {
        void* rec = nullptr;
        if (hs_result r = hs_record_ptr(s, i + 1, l, p, &rec); r != HS_OK) return fail("record", r);
        FillImportRecord(want.data(), c.record_bytes, c.seed, i + 1, l, p);
        if (std::memcmp(rec, want.data(), c.record_bytes) != 0) {
          std::fprintf(stderr, "hisparse-bench import: request %u layer %u position %u differs\n", i + 1, l, p);
          hs_session_close(s);
          return 1;
        }
      }
    }
  }
  hs_session_close(s);
  Report(c, *figures, "self");
  return 0;
}

}  // namespace

// True when --daemon names a unix socket another uid owns. UCX's shared memory admits only the
// daemon's uid, and a writer of another uid does not always learn that when it connects (the
// sysv transport's shmat fails later, on the first send), so such a writer asks for tcp at once.
bool DaemonOfAnotherUid(const std::string& address) {
  constexpr std::string_view kUnix = "unix:";
  if (address.compare(0, kUnix.size(), kUnix) != 0) return false;
  struct stat st {};
  return ::stat(address.c_str() + kUnix.size(), &st) == 0 && st.st_uid != ::geteuid();
}

int ImportMain(int argc, char** argv) {
  Config c;
  if (int rc = ParseFlags(argc, argv, &c); rc >= 0) return rc;
  if (c.tls.empty() && DaemonOfAnotherUid(c.daemon)) {
    std::fprintf(stderr, "hisparse-bench import: the daemon is another uid's: writing over tcp\n");
    c.tls = "tcp";
  }
  return c.self ? SelfMain(c) : AgentMain(c);
}

}  // namespace hisparse::bench
