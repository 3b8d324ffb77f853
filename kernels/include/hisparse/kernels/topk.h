// TOP-K: the selection step of top-k sparse attention, as RESOLVE's positions. For every row of a
// batch of float32 scores (an indexer's, one per earlier position), the positions of its k largest
// scores, ready to pass to RESOLVE (resolve.h) as that row's list. The CUDA kernel (topk_cuda.h)
// and the CPU reference here write identical lists for identical inputs.
//
// Why it is here: an engine that hides RESOLVE's misses by cutting a layer's rows into ranges
// (docs/INTEGRATION.md, "Hiding the misses") runs the top-k once per range, and a top-k whose cost
// is mostly fixed per call (torch.topk: ~60 us for a few rows of 128k scores, ~100 us for 32) eats
// what the ranges hide. This one gives each row a cluster of up to 8 thread blocks, as many as the
// call's rows leave room for, so a call of a few rows costs about one row's time, and a row's list
// is a function of its scores alone, which cutting the call into ranges needs. On an H100, k 2048
// of 131,136 scores: ~34 us a call at 1-7 rows, ~52 at 22-29, against torch.topk's 54-92
// (bench/RESULTS.md, "A top-k of a cluster a row"). An engine with its own per-row top-k (SGLang's
// DSA one) may keep it; the selection needs only to be the same bits in every mode compared.
//
// The contract, per row i of the batch:
//  1. Rows i >= *batch_size (when batch_size is given; read at run time, clamped to [0, rows], so
//     one captured graph serves every batch) get -1 in all k columns; their scores are not read.
//  2. Row i considers its first n_i scores: n_i = cols, or min(seq_lens[i], cols) when seq_lens is
//     given (a negative length counts as 0). A score that is -inf or NaN is never selected.
//  3. Scores compare by IEEE-754 total order of their bits (-0 below +0; +inf is selectable).
//  4. If at most k scores are selectable, every one of them is selected; otherwise the k largest,
//     and among the scores equal to the k-th largest, those of the lowest positions.
//  5. The list holds the selected positions in ascending order, then -1 up to column k.
// So a row's list is a function of its own scores alone: the rows beside it in a call, the call's
// batch size and the device never change it.
#ifndef HISPARSE_KERNELS_TOPK_H_
#define HISPARSE_KERNELS_TOPK_H_

#include <stdint.h>

#include <string>

namespace hisparse {

struct TopkDesc {
  const float* scores = nullptr;        // [rows][ld]
  int64_t ld = 0;                       // elements between rows, >= cols
  int32_t cols = 0;                     // scores a row may hold, >= 0
  int32_t rows = 0;                     // capacity of the arrays (max_batch), >= 0
  int32_t k = 0;                        // >= 1
  const int32_t* batch_size = nullptr;  // int32 [1], or null: all rows
  const int32_t* seq_lens = nullptr;    // int32 [rows], or null: cols each
  int32_t* positions = nullptr;         // int32 [rows][k], written
  // Null, or a count that the kernels writing `scores` raise as their programs finish (a release):
  // LaunchTopk then launches the top-k as the programmatic dependent of the stream's previous kernel,
  // and its blocks read nothing until *after_count >= after_target (an acquire), not waiting for the
  // kernels before it (hs_topk_args.after_count says what the caller guarantees). The CPU reference
  // ignores it: on the host the scores are complete when it is called.
  const int32_t* after_count = nullptr;
  int32_t after_target = 0;  // >= 0
};

// Why `d` cannot be run ("" when it can): null arrays, k < 1, cols outside [0, kTopkMaxCols],
// rows < 0, ld < cols, or a row stride whose offsets overflow int64.
std::string CheckTopkDesc(const TopkDesc& d);

// The contract, on host memory. `d` must pass CheckTopkDesc.
void TopkReference(const TopkDesc& d);

#ifdef __CUDACC__
#define HS_TOPK_HD __host__ __device__
#else
#define HS_TOPK_HD
#endif

// The ordered key of rule 3: larger float (in total order) -> larger unsigned key.
HS_TOPK_HD inline uint32_t TopkKey(uint32_t bits) { return bits ^ ((bits >> 31) ? 0xFFFFFFFFu : 0x80000000u); }
// Keys at or below this one are -inf or a negative NaN; above kTopkKeyPosInf, a positive NaN.
inline constexpr uint32_t kTopkKeyNegInf = 0x007FFFFFu;
inline constexpr uint32_t kTopkKeyPosInf = 0xFF800000u;
HS_TOPK_HD inline bool TopkSelectable(uint32_t key) { return key > kTopkKeyNegInf && key <= kTopkKeyPosInf; }
// The most scores a row may hold (so that a kernel's tile arithmetic stays in int32).
inline constexpr int32_t kTopkMaxCols = 1 << 30;

}  // namespace hisparse

#endif  // HISPARSE_KERNELS_TOPK_H_
