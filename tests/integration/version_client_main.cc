// hisparse-version-client-KIND: this build's client, compiled to report another release at
// OpenSession (HISPARSE_CLIENT_REPORTED_VERSION, client/client_version.h): the client of an
// older or newer release that version_clients_test.cc holds the daemon's rule to. Uses only the
// C ABI calls every minor of ABI 1 has (open, admit, store, record_ptr, release, stats).
//   hisparse-version-client-KIND ADDRESS
// Prints, on stdout, "reports hisparse VERSION", then "admit, store, release OK" and exits 0 when
// the session works, or "refused: RESULT: MESSAGE" and exits 3 when the daemon refuses it (1 on
// any other failure, with what failed).
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <vector>

#include "client_version.h"
#include "hisparse/hisparse.h"

namespace {

constexpr uint32_t kLayers = 2, kRecord = 64, kTokens = 12;
constexpr uint64_t kRequest = 7;

int Fail(const char* what) {
  printf("%s: %s\n", what, hs_last_error());
  return 1;
}

// The record of (layer, position): every byte says where it came from.
uint8_t Byte(uint32_t layer, uint32_t position, uint32_t i) {
  return static_cast<uint8_t>(layer * 89 + position * 7 + i);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s ADDRESS\n", argv[0]);
    return 2;
  }
  printf("reports hisparse %s\n", hisparse::ClientReportedVersion());
  hs_session_options o = HS_SESSION_OPTIONS_INIT;
  o.daemon_address = argv[1];
  o.engine_name = "version-client";
  o.num_layers = kLayers;
  o.record_bytes = kRecord;
  o.k = 4;
  o.slots = 8;
  o.max_requests = 2;
  o.backend = HS_BACKEND_HOST;
  hs_session* s = nullptr;
  const hs_result opened = hs_session_open(&o, &s);
  if (opened != HS_OK) {
    printf("refused: %s: %s\n", hs_result_string(opened), hs_last_error());
    return opened == HS_ERR_FAILED_PRECONDITION ? 3 : 1;
  }
  int rc = 0;
  hs_request_info info = HS_REQUEST_INFO_INIT;
  std::vector<uint8_t> prompt(kLayers * kTokens * kRecord);
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (uint32_t t = 0; t < kTokens; ++t) {
      for (uint32_t i = 0; i < kRecord; ++i) prompt[(l * kTokens + t) * kRecord + i] = Byte(l, t, i);
    }
  }
  if (hs_admit(s, kRequest, kTokens, 2 * kTokens, &info) != HS_OK) {
    rc = Fail("admit");
  } else if (hs_store(s, kRequest, 0, kTokens, kTokens, prompt.data(), kTokens * kRecord, kRecord, nullptr) != HS_OK) {
    rc = Fail("store");
  } else {
    for (uint32_t l = 0; rc == 0 && l < kLayers; ++l) {
      for (uint32_t t = 0; rc == 0 && t < kTokens; ++t) {
        void* record = nullptr;
        if (hs_record_ptr(s, kRequest, l, t, &record) != HS_OK) {
          rc = Fail("record_ptr");
        } else if (memcmp(record, &prompt[(l * kTokens + t) * kRecord], kRecord) != 0) {
          printf("store: the record of layer %u position %u differs from what was stored\n", l, t);
          rc = 1;
        }
      }
    }
    if (hs_release(s, kRequest) != HS_OK && rc == 0) rc = Fail("release");
  }
  hs_stats st = HS_STATS_INIT;
  if (rc == 0 && hs_stats_get(s, &st) != HS_OK) rc = Fail("stats");
  if (rc == 0 && st.session_requests != 0) {
    printf("release: the session still holds %u requests\n", st.session_requests);
    rc = 1;
  }
  hs_session_close(s);
  if (rc == 0) printf("admit, store, release OK\n");
  return rc;
}
