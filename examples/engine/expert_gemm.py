"""A grouped fp8 GEMM for the routed experts at decode batch sizes (dsv32.Experts), issue 44's item 4.

At decode an expert sees a few rows (cap = 8 at 29 rows a GPU), so its GEMM streams the expert's
weights once and does little else: what it costs is how fast the weights stream. On the H200,
torch._scaled_grouped_mm streamed the 32 local experts at ~2.1 TB/s where one plain fp8 GEMM
streams ~3.3 (bench/RESULTS.md), and the MoE is a third of the step. This kernel gives each
program one (expert, tile of output columns, tile of rows) and streams its weight tile over K with
Triton's software pipeline; rows past an expert's cap repeat its last row and are not stored.

    y[e * cap + i, n] = scale * sum_k x[e * cap + i, k] * w[e, n, k]     (fp8 e4m3 in, fp32 sums, bf16 out)

The result is a GEMM like another: dsv32.Experts.choose_gemm times it beside the loop of
torch._scaled_mm and the grouped one, checks it against the loop, and keeps the fastest. Both modes
of the serving benchmark run the one kept, so their logits stay bit-identical to each other.
tests/python/test_serve_bench.py holds it to torch._scaled_mm on the GPU.
"""

from __future__ import annotations

from typing import Tuple

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - the CPU smoke run has no Triton
    triton = None
    tl = None

# (BLOCK_N, BLOCK_K, warps, stages) choose_gemm tries; BLOCK_M follows the rows an expert has.
CONFIGS = [(64, 128, 4, 4), (128, 128, 4, 4), (64, 256, 4, 3)]  # few: each is compiled at start-up


def config_tag(config: Tuple[int, int, int, int]) -> str:
    """A config's name in the benchmark's records: BLOCK_NxBLOCK_K/warps w/stages s."""
    return "%dx%d/%dw/%ds" % config


def available() -> bool:
    return triton is not None and torch.cuda.is_available()


if triton is not None:

    @triton.jit
    def _expert_gemm_kernel(x_ptr, w_ptr, out_ptr, scale, cap, N, K,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        e = tl.program_id(0)
        nb = tl.program_id(1)
        mb = tl.program_id(2)
        rm = mb * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = nb * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        rows = e * cap + tl.minimum(rm, cap - 1)  # past the cap: the last row again, never stored
        xp = x_ptr + rows.to(tl.int64)[:, None] * K + rk[None, :]
        wp = w_ptr + (e.to(tl.int64) * N + rn[:, None]) * K + rk[None, :]
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for _ in range(0, tl.cdiv(K, BLOCK_K)):
            a = tl.load(xp)
            b = tl.load(wp)
            acc = tl.dot(a, tl.trans(b), acc)
            xp += BLOCK_K
            wp += BLOCK_K
        y = (acc * scale).to(tl.bfloat16)
        out = out_ptr + (e * cap + rm).to(tl.int64)[:, None] * N + rn[None, :]
        tl.store(out, y, mask=rm[:, None] < cap)


def block_m(cap: int) -> int:
    """Rows a program takes: the expert's cap rounded up to what tl.dot takes (16), at most 64."""
    m = 16
    while m < cap and m < 64:
        m *= 2
    return m


def grouped_fp8(xq: torch.Tensor, w: torch.Tensor, scale: float, cap: int,
                config: Tuple[int, int, int, int] = CONFIGS[0]) -> torch.Tensor:
    """xq fp8 [E * cap, K] (expert e's rows at [e * cap, (e + 1) * cap)), w fp8 [E, N, K]: bf16
    [E * cap, N]. N and K must be multiples of the config's tiles (ValueError otherwise)."""
    E, N, K = w.shape
    bn, bk, warps, stages = config
    if N % bn or K % bk or xq.shape != (E * cap, K) or not xq.is_contiguous() or not w.is_contiguous():
        raise ValueError(f"expert GEMM: x {tuple(xq.shape)}, w {tuple(w.shape)}, cap {cap}, tiles {bn}x{bk}")
    out = torch.empty(E * cap, N, dtype=torch.bfloat16, device=xq.device)
    bm = block_m(cap)
    _expert_gemm_kernel[(E, N // bn, triton.cdiv(cap, bm))](xq, w, out, scale, cap, N, K, BLOCK_M=bm, BLOCK_N=bn,
                                                            BLOCK_K=bk, num_warps=warps, num_stages=stages)
    return out
