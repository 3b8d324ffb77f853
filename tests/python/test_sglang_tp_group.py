"""HisparsedCoordinator under a TP group of two ranks: two processes joined by torch.distributed
(gloo), each with its own coordinator over the same hisparsed, as SGLang's TP ranks are. The
coordinators agree on a daemon group name over the tp_group, admit every request for the group
(one set of host pages, not one per rank), collect in lockstep (collect_ready_reqs' MIN
all-reduce) and each rank's swap-ins return its own rows' records byte for byte (the stand-ins
and checks of examples/engine/sglang_standins.py). Every size is restored at the end."""

from __future__ import annotations

import multiprocessing as mp
import traceback

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from hisparse.integrations.sglang import HisparsedCoordinator  # noqa: E402
from sglang_standins import Engine as _Engine  # noqa: E402
from sglang_standins import HiSparseAllocator, HiSparseDSAPool, ReqToTokenPool, Req  # noqa: E402

LAYERS, RECORD, K, B, PHYSICAL = 2, 64, 4, 8, 256


def _select(req, seq_len: int, layer: int) -> list:
    return sorted({0, 1, seq_len // 2, seq_len - 1})[:K]


def Engine(address, tp_group=None) -> _Engine:
    pool = HiSparseDSAPool(LAYERS, PHYSICAL, RECORD)
    alloc = HiSparseAllocator(pool, PHYSICAL)
    r2t = ReqToTokenPool(4, 128)
    coord = HisparsedCoordinator(r2t, alloc, K, B, "cpu", tp_group, daemon=address, backend="host")
    return _Engine(coord, alloc, r2t, K, _select)


def _sizes_restored(eng: _Engine) -> None:
    assert eng.alloc.hisparse_attn_allocator.available_size() == PHYSICAL
    assert eng.alloc.logical_attn_allocator.available_size() == eng.alloc.size_full
    assert len(eng.r2t.free_slots) == eng.r2t.size  # every slot back (row 0 is the pad row)


def _requests():
    return [Req("a", 3, 40), Req("b", 5, 20)]


def _join_and_prefill(rank: int, world: int, init_file: str, address: str):
    """A rank's process group and engine, with _requests() prefilled and collected."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    eng = Engine(address, tp_group=dist.group.WORLD)
    reqs = _requests()
    for r in reqs:
        eng.prefill(r)
    assert eng.coord.collect_ready_reqs() == reqs
    return eng, reqs


def _rank_main(rank: int, world: int, init_file: str, address: str, out) -> None:
    try:
        eng, reqs = _join_and_prefill(rank, world, init_file, address)
        dist.barrier()  # every rank has admitted and stored
        admitted = eng.coord.session.stats().pool_used_bytes
        dist.barrier()
        for _ in range(3):
            eng.decode(reqs)
        for r in reqs:
            eng.finish(r)
        dist.barrier()  # every rank has released its share
        st = eng.coord.session.stats()
        _sizes_restored(eng)
        eng.coord.destroy()
        out.put((rank, "ok", admitted, st.pool_used_bytes, eng.coord.session.group))
    except BaseException:  # noqa: BLE001 - reported to the parent
        out.put((rank, traceback.format_exc(), 0, 0, None))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_a_tp_group_holds_one_copy_and_every_rank_reads_its_records(daemon, tmp_path):
    # One rank alone first: the pool bytes of these two requests, held once.
    solo = Engine(daemon)
    reqs = _requests()
    for r in reqs:
        solo.prefill(r)
    assert solo.coord.collect_ready_reqs() == reqs
    one_copy = solo.coord.session.stats().pool_used_bytes
    assert one_copy > 0
    for r in reqs:
        solo.finish(r)
    _sizes_restored(solo)
    solo.coord.destroy()

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    init_file = str(tmp_path / "dist_init")
    procs = [ctx.Process(target=_rank_main, args=(rank, 2, init_file, daemon.address, out)) for rank in range(2)]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    for rank, status, admitted, after, group in results:
        assert status == "ok", f"rank {rank}:\n{status}"
        assert admitted == one_copy, f"rank {rank}: {admitted} bytes in the pool for two ranks, one copy is {one_copy}"
        assert after == 0, f"rank {rank}: {after} bytes left in the pool"
    assert results[0][4] == results[1][4] and results[0][4].startswith("sglang-")


def _riding_rank_main(rank: int, world: int, init_file: str, address: str, out, decoded, killed) -> None:
    """A rank that decodes, waits while the parent SIGKILLs the daemon (under hisparse-keeper), then
    rides through at its next iteration: the ranks agree, and both retract the same requests (a
    group request is never durable), prefill them again into the restarted daemon's group and
    decode on."""
    try:
        eng, reqs = _join_and_prefill(rank, world, init_file, address)
        eng.decode(reqs)
        assert eng.coord.ride_through() == []  # both live: the MAX all-reduce says so
        decoded.put(rank)
        if rank == 0:  # rank 1 goes on at once: its session may not have seen the kill yet
            killed.get(timeout=60)
            while eng.coord.session.alive:
                pass
        else:
            killed.get(timeout=60)
        lost = eng.coord.ride_through()
        assert sorted(lost) == ["a", "b"], lost
        for r in reqs:
            eng.retract(r)
        for r in reqs:
            eng.prefill(r)
        assert eng.coord.collect_ready_reqs() == reqs
        eng.decode(reqs)
        for r in reqs:
            eng.finish(r)
        dist.barrier()
        _sizes_restored(eng)
        eng.coord.destroy()
        out.put((rank, "ok"))
    except BaseException:  # noqa: BLE001 - reported to the parent
        out.put((rank, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_a_tp_group_rides_through_a_restart_of_hisparsed_in_step(keeper, tmp_path):
    ctx = mp.get_context("spawn")
    out, decoded, killed = ctx.Queue(), ctx.Queue(), ctx.Queue()
    init_file = str(tmp_path / "dist_init")
    procs = [ctx.Process(target=_riding_rank_main, args=(rank, 2, init_file, keeper.address, out, decoded, killed))
             for rank in range(2)]
    for p in procs:
        p.start()
    for _ in procs:
        decoded.get(timeout=120)
    keeper.kill_daemon()
    for _ in procs:
        killed.put(True)
    results = sorted(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    for rank, status in results:
        assert status == "ok", f"rank {rank}:\n{status}"

