"""hisparse.topk (hs_topk, ABI 1.16) on host memory: the CPU reference through the C ABI, as the
serving benchmark's CPU smoke runs it. The CUDA kernel is held to the same reference by
tests/gpu/topk_gpu_test.cu and, at the serving shapes, by test_serve_bench."""

from __future__ import annotations

import pytest

import hisparse

np = pytest.importorskip("numpy")


def test_ascending_positions_of_the_largest_ties_to_the_lower():
    s = np.array([[0.5, 3.0, -1.0, 3.0, 3.0], [2.0, 9.0, 1.0, 1.0, 8.0]], dtype=np.float32)
    out = np.full((2, 3), 7, dtype=np.int32)
    hisparse.topk(s, out)
    assert out.tolist() == [[1, 3, 4], [0, 1, 4]]


def test_lengths_batch_size_and_padding():
    s = np.array([[1, -np.inf, np.nan, 4], [5, 6, 7, 8], [1, 2, 3, 4]], dtype=np.float32)
    out = np.full((3, 3), 7, dtype=np.int32)
    hisparse.topk(s, out, seq_lens=np.array([4, 2, 4], dtype=np.int32), batch_size=np.array([2], dtype=np.int32))
    assert out.tolist() == [[0, 3, -1], [0, 1, -1], [-1, -1, -1]]


def test_strided_rows_of_a_wider_buffer():
    wide = np.arange(24, dtype=np.float32).reshape(3, 8)
    view = wide[:, :5]  # rows 8 apart, 5 scores each: the last 3 columns are never read
    wide[:, 5:] = 1e9
    out = np.zeros((3, 2), dtype=np.int32)
    hisparse.topk(view, out)
    assert out.tolist() == [[3, 4]] * 3


def test_torch_cpu_tensors_equal_torch_topk_sets():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(3)
    s = torch.randn(6, 5000, generator=g)
    out = torch.empty(6, 300, dtype=torch.int32)
    hisparse.topk(s, out)
    want = torch.sort(s.topk(300, dim=1).indices.to(torch.int32), dim=1).values
    assert torch.equal(out, want)


def test_bad_input_is_refused_and_writes_nothing():
    s = np.ones((2, 4), dtype=np.float32)
    out = np.full((2, 3), 7, dtype=np.int32)
    with pytest.raises(hisparse.InvalidArgument):
        hisparse.topk(s.astype(np.float64), out)
    with pytest.raises(hisparse.InvalidArgument):
        hisparse.topk(s, np.zeros((3, 3), dtype=np.int32))  # rows differ
    with pytest.raises(hisparse.InvalidArgument):
        hisparse.topk(s, out.astype(np.int64))
    with pytest.raises(hisparse.InvalidArgument):
        hisparse.topk(s, np.zeros((2, 0), dtype=np.int32))  # k 0
    with pytest.raises(hisparse.InvalidArgument):
        hisparse.topk(s, out, seq_lens=np.zeros(1, dtype=np.int32))  # shorter than the rows
    with pytest.raises(hisparse.InvalidArgument, match="after_count"):
        hisparse.topk(s, out, after_count=np.zeros(1, dtype=np.int32), after_target=1)  # a kernel's count only
    assert (out == 7).all()
