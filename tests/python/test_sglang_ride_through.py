"""The SGLang adapter rides through a restart of hisparsed (issue 42, part 2), on the stand-ins of
examples/engine/sglang_standins.py (SGLang's two index spaces, allocator, request pool, DSA
backend; every attention read checked against the full-HBM answer) and a real hisparsed under
hisparse-keeper, whose fd store keeps the pool across the daemon's SIGKILL. A request admitted with
a lease decodes on after HisparsedCoordinator.ride_through with no prefill; one without is
reported lost, never read from old memory, retracted as SGLang retracts (retract_req, its KV
freed) and prefilled again."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conftest import keeper, wait_for  # noqa: E402,F401 (keeper: a fixture)
from sglang_rig import PHYSICAL, engine_factory  # noqa: E402
from sglang_standins import Req  # noqa: E402


@pytest.fixture
def sglang(keeper):  # noqa: F811 (the fixture above)
    yield from engine_factory(keeper)


def test_a_durable_request_decodes_on_after_a_restart(sglang, keeper):  # noqa: F811
    engine = sglang(lease_seconds=60)
    a, b = Req("ka", 21, 40), Req("kb", 22, 30)
    engine.prefill(a)
    engine.prefill(b)
    assert engine.collect() == [a, b]
    engine.decode([a, b])
    rows = engine.coord.row_of_pool_idx.clone()
    keeper.kill_daemon()
    wait_for(lambda: not engine.coord.session.alive, timeout_s=20, what="the coordinator's session to end")
    assert engine.coord.ride_through() == []
    assert engine.coord.session.alive and engine.coord.ride_through() == []  # live: nothing to do
    for r in (a, b):
        assert int(engine.coord.row_of_pool_idx[r.req_pool_idx]) >= 0
    assert engine.coord.row_of_pool_idx.shape == rows.shape
    checked = engine.checked
    engine.decode([a, b])  # every read checked against the full-HBM answer
    engine.decode([a, b])
    assert engine.checked > checked
    engine.finish(a)
    engine.finish(b)
    st = engine.coord.session.stats()
    assert st.session_requests == 0 and st.session_host_bytes == 0
    assert engine.alloc.hisparse_attn_allocator.available_size() == PHYSICAL


def test_a_plain_request_is_lost_retracted_and_prefilled_again(sglang, keeper):  # noqa: F811
    engine = sglang()
    a = Req("la", 31, 40)
    engine.prefill(a)
    assert engine.collect() == [a]
    engine.decode([a])
    keeper.kill_daemon()
    wait_for(lambda: not engine.coord.session.alive, timeout_s=20, what="the coordinator's session to end")
    assert engine.coord.ride_through() == ["la"]
    assert int(engine.coord.row_of_pool_idx[a.req_pool_idx]) == -1  # RESOLVE refuses it meanwhile
    engine.retract(a)  # the scheduler's retraction: retract_req, then SGLang frees its KV
    assert engine.alloc.hisparse_attn_allocator.available_size() == PHYSICAL
    engine.prefill(a)  # it comes back and is prefilled again
    assert engine.collect() == [a]
    engine.decode([a])
    engine.finish(a)
    st = engine.coord.session.stats()
    assert st.session_requests == 0 and st.session_host_bytes == 0
    assert (engine.coord.row_of_pool_idx == -1).all()
