// DispatchRecordBytes: the one place where a runtime record size becomes a compile-time one for
// the copy kernels (RESOLVE's and the replay's CopyChunk, kernels/resolve.cu).
//
// CopyChunk spreads a chunk's 16-byte units over the lanes across record borders, so every unit
// divides its index by the record's units (UPR = record_bytes / 16). A constant UPR turns that
// division into a multiply-shift and lets the compiler fold the border arithmetic; UPR = 0 is
// the generic kernel, which divides at run time and serves every other size. The specialised
// sizes are the records engines use (docs/INTEGRATION.md, bench/RESULTS.md):
//   656 B  DeepSeek-V3.2's FlashMLA fp8 layout: 512 B fp8 e4m3 latent + 4 float32 tile scales
//          + 64 bf16 rotary elements (41 units);
//   1152 B the bf16 MLA latent, (512 + 64) elements * 2 bytes (72 units);
//   512 B  32 units, one per lane: the third size of the benchmark's grid (hisparse-bench
//          resolve --record-bytes 512,656,1152), as large as the fp8 latent alone.
// Sizes the kernels cannot take at all (not a multiple of 16, outside [16, 16384]) never get here:
// every launcher checks the geometry first (CheckGeometry: "unsupported record_bytes: N ...").
//
// Host code only; header-only; no state.
#ifndef HISPARSE_KERNELS_RECORD_DISPATCH_H_
#define HISPARSE_KERNELS_RECORD_DISPATCH_H_

#include <cstdint>
#include <type_traits>

namespace hisparse {
namespace internal {

// Calls f(std::integral_constant<int, UPR>{}) with the UPR compiled for `record_bytes` (0 for a
// size without its own kernel) and returns what f returns. Use decltype(upr)::value as the
// template argument.
template <typename F>
decltype(auto) DispatchRecordBytes(uint32_t record_bytes, F&& f) {
  switch (record_bytes) {
    case 656:
      return f(std::integral_constant<int, 41>{});
    case 1152:
      return f(std::integral_constant<int, 72>{});
    case 512:
      return f(std::integral_constant<int, 32>{});
    default:
      return f(std::integral_constant<int, 0>{});
  }
}

}  // namespace internal
}  // namespace hisparse

#endif  // HISPARSE_KERNELS_RECORD_DISPATCH_H_
