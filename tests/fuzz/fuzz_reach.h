// What an input reached. A target calls Reached(kind) at each step its input drives past decoding
// the fuzzer's bytes (an op that ran against the code under test, a document that parsed, a record
// that was read), and names every kind it can report in HS_FUZZ_STEP_KINDS. The corpus replay
// (corpus_replay_test.cc) defines the hook and holds every seed to at least one step, and the
// corpus as a whole to every kind the target names: a seed that stops driving anything, or a kind
// no seed reaches any more, fails there. Under libFuzzer nothing defines the hook (it is weak), and
// Reached costs a null check.
#ifndef HISPARSE_TESTS_FUZZ_FUZZ_REACH_H_
#define HISPARSE_TESTS_FUZZ_FUZZ_REACH_H_

extern "C" void HisparseFuzzReached(const char* kind) __attribute__((weak));
// The kinds a target reports, ending in nullptr (defined by HS_FUZZ_STEP_KINDS, once per target).
extern "C" const char* const* HisparseFuzzStepKinds();

#define HS_FUZZ_STEP_KINDS(...)                                 \
  extern "C" const char* const* HisparseFuzzStepKinds() {       \
    static const char* const kKinds[] = {__VA_ARGS__, nullptr}; \
    return kKinds;                                              \
  }

namespace hisparse::fuzz {

inline void Reached(const char* kind) {
  if (HisparseFuzzReached != nullptr) HisparseFuzzReached(kind);
}

}  // namespace hisparse::fuzz

#endif  // HISPARSE_TESTS_FUZZ_FUZZ_REACH_H_
