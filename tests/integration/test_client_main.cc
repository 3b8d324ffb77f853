// hisparse-test-client: an engine stand-in that the integration and fault tests start as a
// separate process and kill. Uses only the C ABI.
//   hisparse-test-client ADDRESS hold N        open a session, admit N requests, write a record in
//                                              each, print "READY <session_id>", wait to be killed
//   hisparse-test-client ADDRESS churn         admit/release in a loop forever (killed at random)
//   hisparse-test-client ADDRESS group NAME RANK SIZE N
//                                              as hold, the session rank RANK of TP group NAME of
//                                              SIZE ranks and the requests group admissions
//   hisparse-test-client ADDRESS open-timed    open a session with a 60 s control timeout, print
//                                              "rc=R ms=T error=E" (the call's result, how long it
//                                              took, hs_last_error) and exit 0
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hisparse/hisparse.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: hisparse-test-client ADDRESS hold N | churn\n");
    return 2;
  }
  hs_session_options o = HS_SESSION_OPTIONS_INIT;
  o.daemon_address = argv[1];
  o.engine_name = "test-client";
  o.num_layers = 4;
  o.record_bytes = 128;
  o.k = 16;
  o.slots = 32;
  o.max_requests = 64;
  o.backend = HS_BACKEND_HOST;
  const int group = strcmp(argv[2], "group") == 0;
  if (group) {
    if (argc < 7) {
      fprintf(stderr, "usage: hisparse-test-client ADDRESS group NAME RANK SIZE N\n");
      return 2;
    }
    o.group = argv[3];
    o.group_rank = (uint32_t)atoi(argv[4]);
    o.group_size = (uint32_t)atoi(argv[5]);
  }
  hs_session* s = nullptr;
  if (strcmp(argv[2], "open-timed") == 0) {
    o.timeout_ms = 60000;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const hs_result r = hs_session_open(&o, &s);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    printf("rc=%d ms=%.3f error=%s\n", (int)r, ms, r == HS_OK ? "" : hs_last_error());
    if (r == HS_OK) hs_session_close(s);
    return 0;
  }
  if (hs_session_open(&o, &s) != HS_OK) {
    fprintf(stderr, "open: %s\n", hs_last_error());
    return 1;
  }
  hs_session_info info = HS_SESSION_INFO_INIT;
  hs_session_get_info(s, &info);
  if (strcmp(argv[2], "hold") == 0 || group) {
    const int n = group ? atoi(argv[6]) : argc > 3 ? atoi(argv[3]) : 1;
    for (int i = 1; i <= n; ++i) {
      hs_request_info ri = HS_REQUEST_INFO_INIT;
      const hs_result r =
          group ? hs_admit_group(s, (uint64_t)i, 100, 1000, &ri) : hs_admit(s, (uint64_t)i, 100, 1000, &ri);
      if (r != HS_OK) {
        fprintf(stderr, "admit: %s\n", hs_last_error());
        return 1;
      }
      void* rec = nullptr;
      if (hs_record_ptr(s, (uint64_t)i, 0, 0, &rec) == HS_OK) memset(rec, 0xAB, 128);
    }
    printf("READY %lu\n", (unsigned long)info.session_id);
    fflush(stdout);
    for (;;) pause();
  }
  if (strcmp(argv[2], "churn") == 0) {
    printf("READY %lu\n", (unsigned long)info.session_id);
    fflush(stdout);
    for (uint64_t id = 1;; ++id) {
      hs_request_info ri = HS_REQUEST_INFO_INIT;
      if (hs_admit(s, id, 10, 200, &ri) == HS_OK && (id % 3) != 0) hs_release(s, id);
    }
  }
  fprintf(stderr, "unknown mode %s\n", argv[2]);
  return 2;
}
