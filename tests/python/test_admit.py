"""Session.admit, the one admission (hs_admit2, ABI 1.10), against a real hisparsed: keyword options
that combine, contradictions refused with the arguments named before anything is admitted, one
error type (AdmissionError) that is also each code's class, and admit_batch on hs_admit_batch2
with per-item options."""

from __future__ import annotations

import pytest

import hisparse


def test_every_admission_failure_is_an_admission_error_of_its_codes_class(open_session):
    s = open_session(max_requests=2)
    s.admit(1, 0, 16)
    with pytest.raises(hisparse.AdmissionError) as e:
        s.admit(1, 0, 16)
    assert isinstance(e.value, hisparse.AlreadyExists) and e.value.request_id == 1
    assert e.value.code == hisparse._lib.HS_ERR_ALREADY_EXISTS
    s.admit(2, 0, 16)
    with pytest.raises(hisparse.ResourceExhausted) as e:  # two rows: handlers of the code still work
        s.admit(3, 0, 16)
    assert isinstance(e.value, hisparse.AdmissionError) and e.value.request_id == 3
    with pytest.raises(hisparse.AdmissionError) as e:
        s.admit(4, 0, 16, parent=77, prefix_tokens=4)
    assert isinstance(e.value, hisparse.NotFound)
    assert s.stats().session_requests == 2


@pytest.mark.parametrize("kwargs, named", [
    (dict(parent=1), ["parent_request_id", "prefix_tokens"]),
    (dict(prefix_tokens=8), ["prefix_tokens", "parent_request_id"]),
    (dict(group=True, lease_seconds=60), ["HS_ADMIT_GROUP", "lease_seconds"]),
    (dict(group=True, parent=1, prefix_tokens=8), ["HS_ADMIT_GROUP", "parent_request_id"]),
    (dict(group=True, begin_import=True), ["HS_ADMIT_GROUP", "HS_ADMIT_IMPORT"]),
    (dict(begin_import=True, lease_seconds=60), ["HS_ADMIT_IMPORT", "lease_seconds"]),
    (dict(begin_import=True, parent=1, prefix_tokens=8), ["HS_ADMIT_IMPORT", "parent_request_id"]),
])
def test_contradictions_are_refused_naming_the_arguments(open_session, kwargs, named):
    s = open_session()
    s.admit(1, 0, 64)
    with pytest.raises(hisparse.InvalidArgument) as e:
        s.admit(2, 0, 64, **kwargs)
    assert isinstance(e.value, hisparse.AdmissionError)
    for name in named:
        assert name in str(e.value)
    assert s.stats().session_requests == 1


def test_options_combine_a_durable_shared_prefix(open_session):
    """A shared prefix that is durable from admission: one call, which no older call could make."""
    s = open_session()
    s.admit(1, 0, 300)
    child = s.admit(2, 0, 400, parent=1, prefix_tokens=256, lease_seconds=60)
    assert child.capacity_tokens >= 400
    adoptable_if_closed = [r for r in s.list_adoptable()]
    assert adoptable_if_closed == []  # this session is alive: nothing is an orphan yet
    s.set_lease(2, 0)  # it was durable: clearing its lease works and leaves it admitted
    assert s.stats().session_requests == 2


def test_admit_batch_takes_per_item_options(open_session):
    s = open_session(max_requests=4)
    got = s.admit_batch([(1, 0, 16), dict(request_id=2, token_budget=32, lease_seconds=60),
                         dict(request_id=3, context_tokens=4, token_budget=16)])
    assert [type(g) for g in got] == [hisparse.RequestInfo] * 3
    assert got[1].capacity_tokens >= 32
    with pytest.raises(hisparse.InvalidArgument):
        s.admit_batch([dict(request_id=9, token_budget=16, parent=1)])  # no shared prefix in a batch
    with pytest.raises(hisparse.AdmissionError) as e:
        s.admit_batch([(4, 0, 16), (1, 0, 16)])  # 1 is admitted already: the batch fails on it
    assert isinstance(e.value, hisparse.AlreadyExists)
    assert e.value.item == 1 and e.value.request_id == 1
    assert all(isinstance(r, hisparse.AdmissionError) for r in e.value.results)
    per_item = s.admit_batch([(4, 0, 16), (1, 0, 16)], all_or_nothing=False)
    assert isinstance(per_item[0], hisparse.RequestInfo)
    assert isinstance(per_item[1], hisparse.AdmissionError) and per_item[1].request_id == 1
    assert s.stats().session_requests == 4
