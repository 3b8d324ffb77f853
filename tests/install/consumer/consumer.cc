// Links against the installed libhisparse and calls it: proves the exported target, the headers
// and the shared library are complete without anything from the source tree.
#include <cstdio>

#include "hisparse/hisparse.hpp"

int main() {
  hs_session_options o = HS_SESSION_OPTIONS_INIT;
  o.daemon_address = "unix:/nonexistent/hisparse.sock";
  o.timeout_ms = 200;
  hisparse::Session s;
  hisparse::Error e = hisparse::Session::Open(o, &s);
  std::printf("abi %d, open without a daemon: %s (%s)\n", hs_abi_version(), hs_result_string(e.code),
              e.message.c_str());
  return e.code == HS_ERR_UNAVAILABLE ? 0 : 1;
}
