// Placeholder: `hisparse-bench trace` lands here.
#include <cstdio>
#include "bench_cmd.h"
namespace hisparse::bench {
int TraceMain(int, char**) { std::fprintf(stderr, "not built yet\n"); return 2; }
}  // namespace hisparse::bench
