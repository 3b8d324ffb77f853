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

from conftest import wait_for  # noqa: E402
from sglang_rig import PHYSICAL, engine_factory  # noqa: E402
from sglang_standins import Req  # noqa: E402


@pytest.fixture
def sglang(keeper):
    yield from engine_factory(keeper)


def test_a_durable_request_decodes_on_after_a_restart(sglang, keeper):
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


def test_a_plain_request_is_lost_retracted_and_prefilled_again(sglang, keeper):
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


# ---- the plugin's hook around SGLang's scheduler step ----

class ScheduleBatch:
    """Stand-in for sglang.srt.managers.schedule_batch.ScheduleBatch (sgl-project/sglang 0003215cf146)
    as retraction uses it: reqs; release_req(idx, remaining, server_args) = the module's release_req
    (hisparse_coordinator.retract_req for an unfinished request, its KV freed, reset_for_retract);
    filter_batch(keep_indices=...) keeping those indices in order."""

    def __init__(self, engine, reqs):
        self.engine, self.reqs, self.batch_is_full = engine, list(reqs), True

    def release_req(self, idx, remaing_req_count, server_args):
        req = self.reqs[idx]
        self.engine.retract(req)  # coordinator.retract_req, then SGLang's KV freed, output kept to 1

    def filter_batch(self, chunked_req_to_exclude=None, keep_indices=None):
        self.reqs = [self.reqs[i] for i in keep_indices]


class Scheduler:
    """Stand-in for sglang.srt.managers.scheduler.Scheduler (0003215cf146) as the hook meets it:
    hisparse_coordinator, server_args, get_next_batch_to_run(running_batch, last_batch) (the hook
    wraps it; here it hands back the running batch), _add_request_to_queue(req, is_retracted) into
    the waiting queue."""

    def __init__(self, engine):
        self.hisparse_coordinator, self.server_args, self.waiting_queue = engine.coord, object(), []

    def get_next_batch_to_run(self, running_batch=None, last_batch=None):
        return running_batch

    def _add_request_to_queue(self, req, is_retracted=False):
        assert is_retracted
        self.waiting_queue.append(req)


def test_the_plugin_hook_retracts_what_was_lost_before_the_step(sglang, keeper):
    from hisparse.integrations.sglang_plugin import ride_through_hook

    engine = sglang()
    kept, lost = Req("hk", 41, 40), Req("hl", 42, 36)
    engine.coord.lease_seconds = 60  # kept is admitted durable, lost plain
    engine.prefill(kept)
    engine.coord.lease_seconds = 0
    engine.prefill(lost)
    assert engine.collect() == [kept, lost]
    engine.decode([kept, lost])
    sched, batch = Scheduler(engine), ScheduleBatch(engine, [kept, lost])
    assert ride_through_hook(Scheduler.get_next_batch_to_run, sched, running_batch=batch, last_batch=None) is batch
    assert batch.reqs == [kept, lost] and sched.waiting_queue == []  # live: nothing to do
    keeper.kill_daemon()
    wait_for(lambda: not engine.coord.session.alive, timeout_s=20, what="the coordinator's session to end")
    ride_through_hook(Scheduler.get_next_batch_to_run, sched, running_batch=batch, last_batch=None)
    assert batch.reqs == [kept] and not batch.batch_is_full
    assert sched.waiting_queue == [lost]
    engine.decode(batch.reqs)  # the kept request decodes on, every read checked
    engine.prefill(lost)  # the retracted one is prefilled again
    assert engine.collect() == [lost]
    engine.decode([kept, lost])
    engine.finish(kept)
    engine.finish(lost)
    st = engine.coord.session.stats()
    assert st.session_requests == 0 and st.session_host_bytes == 0
    assert engine.alloc.hisparse_attn_allocator.available_size() == PHYSICAL
