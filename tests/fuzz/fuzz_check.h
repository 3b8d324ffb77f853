// A fuzz target's verdict on a broken invariant: Fail prints "<program>: <what>" and aborts, which
// libFuzzer and the corpus replay tests both report as a failure with that message.
#ifndef HISPARSE_TESTS_FUZZ_FUZZ_CHECK_H_
#define HISPARSE_TESTS_FUZZ_FUZZ_CHECK_H_

#include <errno.h>  // program_invocation_short_name (glibc)

#include <cstdio>
#include <cstdlib>
#include <string>

namespace hisparse::fuzz {

[[noreturn]] inline void Fail(const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", program_invocation_short_name, what.c_str());
  std::abort();
}

inline void Expect(bool ok, const std::string& what) {
  if (!ok) Fail(what);
}

}  // namespace hisparse::fuzz

#endif  // HISPARSE_TESTS_FUZZ_FUZZ_CHECK_H_
