"""Session: one engine process's attachment to hisparsed (an hs_session), as a context manager.

Control calls (admit, extend, release, stats, info) are RPCs to the daemon: milliseconds, never
per decode step. Data-path calls (store, append, resolve) enqueue kernels on the caller's CUDA
stream (CUDA backend) or run the CPU reference at once (host backend); they do no RPC and no
synchronization, so they can be captured in a CUDA graph.

Memory spaces: on the CUDA backend every data-path array is device memory (torch CUDA tensors on
the session's GPU, or __cuda_array_interface__ objects) and the stream defaults to
torch.cuda.current_stream(); on the host backend they are host memory (numpy arrays, CPU
tensors, ctypes arrays, writable buffers) and the stream is ignored.

Views without copies: slot_view() is the slot arena [max_requests, num_layers, record_slots,
record_stride] uint8 (a torch CUDA tensor on the CUDA backend, a numpy array on the host
backend); record_view() is a numpy view of a request's records in the host pool. Both stay valid
until the session closes (record views also until the request is released or moved by extend).

Thread-safety: control calls may come from several threads; data-path calls must be ordered by
the caller, as the C ABI says. Closing while another thread uses the session is a caller error.
"""

from __future__ import annotations

import ctypes
import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import _lib
from ._buffers import CudaArray, _is_torch_tensor, buffer_pointer, host_array, stream_handle
from .errors import (FailedPrecondition, HisparseError, InvalidArgument, Unavailable, admission_error_for, check,
                     check_admission, error_for)

_BACKENDS = {"auto": _lib.HS_BACKEND_AUTO, "host": _lib.HS_BACKEND_HOST, "cuda": _lib.HS_BACKEND_CUDA}
_BACKEND_NAMES = {v: k for k, v in _BACKENDS.items()}
_ARENA_KIND_NAMES = {0: "host", 1: "cuda-vmm", 2: "cuda-ipc", 3: "private-gpu"}  # hs_arena_kind


@dataclasses.dataclass(frozen=True)
class RequestInfo:
    """What admit/extend return: the request's arena row, its host capacity, whether runs moved."""

    row: int
    capacity_tokens: int
    moved: bool = False


@dataclasses.dataclass(frozen=True)
class SessionInfo:
    """hs_session_info: the backend in use and the slot arena's address and layout."""

    session_id: int
    backend: str  # "host" or "cuda"
    slot_base: int  # host or device address of slot 0 of (row 0, layer 0)
    record_stride: int  # bytes between consecutive slots
    slots: int  # B; slot B of each (row, layer) holds the newest token
    max_tokens_per_request: int
    arena_bytes: int
    arena_kind: str  # "host", "cuda-vmm", "cuda-ipc" or "private-gpu" (hs_arena_kind)
    draft_tokens: int = 0  # n: tail slots B..B+n of each (row, layer) (ABI 1.4)
    control_lane: bool = False  # lifecycle calls go over the session's control lane, not gRPC (ABI 1.12)


@dataclasses.dataclass(frozen=True)
class Stats:
    """hs_stats: the node's host pool, this session's share and its RESOLVE counters."""

    pool_capacity_bytes: int
    pool_used_bytes: int
    pool_free_bytes: int
    pool_fragmentation: float
    sessions: int
    requests: int
    session_requests: int
    session_host_bytes: int
    hits: int
    misses: int
    bytes_fetched: int

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


def _backend_code(backend: Union[str, int]) -> int:
    if isinstance(backend, int):
        if backend not in _BACKEND_NAMES:
            raise InvalidArgument(f"backend {backend} is not an hs_backend")
        return backend
    try:
        return _BACKENDS[backend]
    except KeyError:
        raise InvalidArgument(f"backend must be one of {sorted(_BACKENDS)}, got {backend!r}") from None


@dataclasses.dataclass(frozen=True)
class Recovery:
    """What Session.recover() kept and lost."""

    old_session_id: int
    new_session_id: int
    kept: Dict[int, Optional[int]]  # request id -> its new row (None: parked; resume() it)
    capacity_tokens: Dict[int, int]  # request id -> its capacity, as before
    lost: List[int]  # every other request the ended session held: re-prefill or fail them
    attempts: int  # sessions tried before one opened
    seconds: float
    arena_moved: bool  # False: the slot arena kept its address (captured CUDA graphs replay as they are)


class Session:
    """An open hs_session. Use as a context manager, or call close().

    Args:
      address: "unix:PATH" of the daemon, or a Daemon; None: $HISPARSE_DAEMON, else the node's
        default socket unix:/run/hisparse/hisparsed.sock.
      num_layers, record_bytes, k, slots, max_requests: the session geometry (hs_session_options).
      gpu: CUDA device index; -1 for the host-emulated device.
      backend: "auto" (CUDA when gpu >= 0 and the library has it), "host" or "cuda".
      engine_name: shown in the daemon's logs and stats.
      timeout_ms: deadline of each control call (0: the library's 10 s).
      layer_anchor: shared indexers, one entry per layer: layer l reuses the selection of layer
        layer_anchor[l] (<= l, itself an anchor). Followers can then be prefetched (prefetch()).
      draft_tokens: speculative decoding, n = 0..7 draft tokens per step: every (row, layer) gets
        1 + n tail slots B..B+n, resolve() takes up to n + 1 selection lists per row
        (query_counts) and append() up to n + 1 tokens per row (token_counts).
      max_context_tokens: the longest context one request will hold (0: the daemon's
        limits.max_tokens_per_request); sizes the host page tables the GPU keeps (ABI 1.6).
      group, rank, group_size: join the tensor-parallel group `group` as rank `rank` of
        `group_size` (ABI 1.7; docs/DESIGN.md, "TP groups"): one session per TP rank, all of one
        uid and layout; admit(..., group=True) then holds one set of host pages for every rank.
        AlreadyExists for a rank held by a live session, PermissionDenied for another uid's group,
        FailedPrecondition for another size or layout than the members', InvalidArgument for a
        bad name, size, or rank >= group_size.
    """

    def __init__(self, address: Any = None, *, num_layers: int, record_bytes: int, k: int, slots: int,
                 max_requests: int, gpu: int = -1, backend: Union[str, int] = "auto",
                 engine_name: str = "hisparse-python", timeout_ms: int = 0,
                 layer_anchor: Optional[Sequence[int]] = None, draft_tokens: int = 0,
                 max_context_tokens: int = 0, group: Optional[str] = None, rank: int = 0,
                 group_size: int = 0) -> None:
        self._lib = _lib.load()
        self._handle: Optional[Any] = None
        if address is not None and not isinstance(address, str):
            address = address.address  # a Daemon
        self.num_layers = int(num_layers)
        self.record_bytes = int(record_bytes)
        self.k = int(k)
        self.slots = int(slots)
        self.max_requests = int(max_requests)
        self.gpu = int(gpu)
        self.draft_tokens = int(draft_tokens)
        o = _lib.new_session_options()
        self._address_bytes = address.encode() if address else None
        self._engine_bytes = engine_name.encode() if engine_name else None
        o.daemon_address = self._address_bytes
        o.engine_name = self._engine_bytes
        o.gpu = self.gpu
        o.num_layers = self.num_layers
        o.record_bytes = self.record_bytes
        o.k = self.k
        o.slots = self.slots
        o.max_requests = self.max_requests
        o.backend = _backend_code(backend)
        o.timeout_ms = int(timeout_ms)
        o.draft_tokens = self.draft_tokens
        o.max_context_tokens = int(max_context_tokens)
        self.group = group
        self.rank = int(rank)
        self.group_size = int(group_size)
        self._group_bytes = group.encode() if group is not None else None
        o.group = self._group_bytes
        o.group_rank = self.rank
        o.group_size = self.group_size
        self.layer_anchor = [int(a) for a in layer_anchor] if layer_anchor is not None else list(range(self.num_layers))
        if layer_anchor is not None:
            if len(self.layer_anchor) != self.num_layers:
                raise InvalidArgument(f"layer_anchor has {len(self.layer_anchor)} entries; the session has "
                                      f"{self.num_layers} layers")
            self._anchor_array = (ctypes.c_int32 * self.num_layers)(*self.layer_anchor)
            o.layer_anchor = self._anchor_array
        handle = _lib.SessionPtr()
        check(self._lib.hs_session_open(ctypes.byref(o), ctypes.byref(handle)), "open session")
        self._handle = handle
        self._info = self.info()
        self._views: Dict[str, Any] = {}

    # ---- lifetime ----

    @property
    def closed(self) -> bool:
        return self._handle is None

    def close(self) -> None:
        """Ends the session: the daemon releases every request and byte it held, but for durable
        requests, which it keeps parked until their lease ends or another session adopts them.
        Idempotent."""
        handle, self._handle = self._handle, None
        self._views = {}
        if handle is not None:
            self._lib.hs_session_close(handle)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def _h(self):
        if self._handle is None:
            raise Unavailable("the session is closed")
        return self._handle

    # ---- riding through a daemon's restart (ABI 1.11) ----

    @property
    def alive(self) -> bool:
        """False once the daemon ended the session (it stopped, crashed, restarted or closed it):
        every call that needs the daemon and every data-path call then raises Unavailable, and every
        row is unpublished (a captured graph's RESOLVE refuses it). One atomic load: cheap enough to
        read every step. Recover with recover()."""
        state = ctypes.c_int(0)
        check(self._lib.hs_session_get_state(self._h(), ctypes.byref(state)), "session state")
        return state.value == _lib.HS_SESSION_LIVE

    def recover(self, timeout_ms: int = 0) -> Recovery:
        """After the session ended (FailedPrecondition while it is alive): opens a session with the
        same options on whatever daemon answers at the address, retrying with backoff while none
        does, for at most timeout_ms (0: 30 s; then Unavailable); adopts every durable request
        (lease_seconds) the ended session held, on the same pages, resumes those that were live into
        new rows (every slot EMPTY), and makes that session this object's. Returns what was kept
        ({request_id: row}, row None when parked) and lost (re-prefill or fail them). The slot arena
        keeps its address (the new daemon's is mapped in place) unless Recovery.arena_moved says
        otherwise; then views and addresses taken before (slot_view, info().slot_base) are stale
        and CUDA graphs captured over them must be captured again. Call it at
        a step boundary, with the kernels launched on the ended session finished (synchronize their
        stream), and no other call on this session running. On failure the session stays ended and
        recover() may be called again."""
        r = _lib.new_recovery()
        check(self._lib.hs_session_recover(self._h(), int(timeout_ms), ctypes.byref(r)), "recover")
        self._views = {}
        self._info = self.info()
        kept_arr = (_lib.RecoveredRequest * max(1, r.kept))()
        lost_arr = (ctypes.c_uint64 * max(1, r.lost))()
        n_kept, n_lost = ctypes.c_size_t(0), ctypes.c_size_t(0)
        check(self._lib.hs_recovery_kept(self._h(), kept_arr, r.kept, ctypes.byref(n_kept)), "recovery kept")
        check(self._lib.hs_recovery_lost(self._h(), lost_arr, r.lost, ctypes.byref(n_lost)), "recovery lost")
        kept = {int(kept_arr[i].request_id): (None if kept_arr[i].row < 0 else int(kept_arr[i].row))
                for i in range(n_kept.value)}
        capacity = {int(kept_arr[i].request_id): int(kept_arr[i].capacity_tokens) for i in range(n_kept.value)}
        return Recovery(int(r.old_session_id), int(r.new_session_id), kept, capacity,
                        [int(lost_arr[i]) for i in range(n_lost.value)], int(r.attempts), float(r.seconds),
                        bool(r.arena_moved))

    # ---- control path ----

    def admit(self, request_id: int, context_tokens: int, token_budget: int, *, parent: Optional[int] = None,
              prefix_tokens: int = 0, lease_seconds: int = 0, group: bool = False,
              begin_import: bool = False) -> RequestInfo:
        """The one admission (hs_admit2, ABI 1.10): reserves host pages for token_budget tokens
        (every layer) and an arena row, and resets the row. The options combine as hs_admit_args
        says; a contradiction (a parent without prefix_tokens, group with a parent, a lease or
        begin_import, begin_import with a parent or a lease) is refused before any RPC with the
        arguments named. Every failure raises an AdmissionError (also of its code's class:
        ResourceExhausted for a full pool, and so on); a request the daemon admitted but this
        process could not install is released in the daemon before it raises.

        parent (a request of this session, live or parked) with prefix_tokens >= 1: the new
        request's first prefix_tokens positions start as the parent's: its full pages below the
        prefix are shared (read-only in both requests from now on, charged once) and a page the
        prefix ends inside is copied. NotFound for an unknown parent, InvalidArgument for a prefix
        longer than the parent's capacity or token_budget.

        lease_seconds >= 1: durable from admission (see set_lease), with a parent too.

        group=True (a session opened with group=): for the session's TP group: every rank admits
        the same id and token_budget; the first reserves one set of pages and a row in every
        rank's session, or nothing (ResourceExhausted), and later ranks attach to it.
        FailedPrecondition before every rank has joined; each rank releases its own share.

        begin_import=True: importing (docs/DESIGN.md, "Import"); the RequestInfo is the daemon's
        reservation, import_grant() gives the grant for the transfer agent and await_import()
        installs the request once committed (admit_import does all but the last)."""
        a = _lib.new_admit_args()
        a.request_id = request_id
        a.context_tokens = context_tokens
        a.token_budget = token_budget
        a.parent_request_id = 0 if parent is None else parent
        a.prefix_tokens = prefix_tokens
        a.lease_seconds = lease_seconds
        a.flags = (_lib.HS_ADMIT_GROUP if group else 0) | (_lib.HS_ADMIT_IMPORT if begin_import else 0)
        ri = _lib.new_request_info()
        check_admission(self._lib.hs_admit2(self._h(), ctypes.byref(a), ctypes.byref(ri)),
                        f"admit request {request_id}", request_id)
        return RequestInfo(ri.row, ri.capacity_tokens, bool(ri.moved))

    def park(self, request_id: int) -> None:
        """Gives the request's arena row back and keeps its host pages (preemption without
        re-prefill). FailedPrecondition when parked already, NotFound when not admitted."""
        check(self._lib.hs_park(self._h(), request_id), f"park request {request_id}")

    def resume(self, request_id: int) -> RequestInfo:
        """Gives a parked request a row again (possibly another), every slot EMPTY: the next resolve
        fetches what it selects. As after admit, the newest token's slot is the next append's (or
        store's): append the step's token, then resolve. ResourceExhausted when no row is free (it
        stays parked), FailedPrecondition when not parked."""
        ri = _lib.new_request_info()
        check(self._lib.hs_resume(self._h(), request_id, ctypes.byref(ri)), f"resume request {request_id}")
        return RequestInfo(ri.row, ri.capacity_tokens, bool(ri.moved))

    def set_lease(self, request_id: int, lease_seconds: int) -> None:
        """Makes the request durable for lease_seconds from now (0 clears it; ABI 1.7): when this
        session ends, even by the process's death, the request stays in the daemon, parked with its
        host pages, until a session of the same uid and engine_name adopts it or the lease ends.
        InvalidArgument above the daemon's durability.max_lease_seconds; FailedPrecondition when
        durability is off or the request is importing."""
        check(self._lib.hs_set_lease(self._h(), request_id, lease_seconds), f"set the lease of request {request_id}")

    def list_adoptable(self) -> List[Tuple[int, int, float]]:
        """(dead_session_id, request_id, lease_seconds_left) of every durable request that ended
        sessions of this uid and engine_name left and whose lease runs (ABI 1.7)."""
        count = ctypes.c_size_t(0)
        while True:
            n = count.value
            dead = (ctypes.c_uint64 * max(n, 1))()
            ids = (ctypes.c_uint64 * max(n, 1))()
            left = (ctypes.c_double * max(n, 1))()
            rc = self._lib.hs_list_adoptable(self._h(), dead, ids, left, n, ctypes.byref(count))
            if rc == _lib.HS_ERR_RESOURCE_EXHAUSTED:
                continue  # more appeared meanwhile: ask again with room for them
            check(rc, "list adoptable requests")
            return [(dead[i], ids[i], left[i]) for i in range(count.value)]

    def adopt(self, dead_session_id: int) -> List[int]:
        """Adopts every durable request of the ended session (all at once; ABI 1.7) and returns
        their ids: each is this session's now, parked; resume() each for a row (its slots start
        EMPTY), then append and resolve as usual. NotFound (no such session, or every lease ended),
        PermissionDenied (another uid or engine_name), FailedPrecondition (another geometry),
        AlreadyExists (this session uses one of the ids)."""
        # Room for what is listed now and then some (the adoption happens whatever the room).
        cap = max(4096, 2 * len(self.list_adoptable()))
        ids = (ctypes.c_uint64 * cap)()
        count = ctypes.c_size_t(0)
        check(self._lib.hs_adopt(self._h(), dead_session_id, ids, cap, ctypes.byref(count)),
              f"adopt the requests of ended session {dead_session_id}")
        if count.value > cap:
            raise RuntimeError(f"adopted {count.value} requests, more ids than the {cap} asked for")
        return [ids[i] for i in range(count.value)]

    def extend(self, request_id: int, token_budget: int) -> RequestInfo:
        """Grows a request to token_budget tokens by appending pages: no record moves (moved stays
        False on the paged pool; it is kept for the ABI's older daemons)."""
        ri = _lib.new_request_info()
        check(self._lib.hs_extend(self._h(), request_id, token_budget, ctypes.byref(ri)),
              f"extend request {request_id}")
        return RequestInfo(ri.row, ri.capacity_tokens, bool(ri.moved))

    def release(self, request_id: int) -> None:
        """Frees a request's host pages and arena row."""
        check(self._lib.hs_release(self._h(), request_id), f"release request {request_id}")

    def admit_batch(self, items: Sequence[Union[Sequence[int], Dict[str, int]]], all_or_nothing: bool = True, *,
                    begin_import: bool = False) -> List[Union[RequestInfo, bytes, HisparseError]]:
        """Admits several requests in one round trip (hs_admit_batch2, ABI 1.10). Each item is a
        (request_id, context_tokens, token_budget) triple or a dict of admit's keywords
        (request_id, context_tokens, token_budget, lease_seconds, begin_import), 1..1024 of them,
        each with admit's rules (an id named twice is InvalidArgument for the later item); every
        admitted request is mapped as admit maps it. A shared prefix or group is not served in a
        batch (admit them one by one).

        all_or_nothing=True: returns every item's RequestInfo, or raises the failing item's
        AdmissionError with nothing admitted; the error's ``item`` is that item's index and
        ``results`` every item's error (Aborted for the others). A full pool fails the batch: the
        daemon evicts nothing for it. all_or_nothing=False: each item on its own; the list holds
        each admitted item's RequestInfo and each refused item's AdmissionError (returned, not
        raised).

        begin_import=True (or an item's own begin_import): the item is admitted as admit_import
        admits it, and its entry is its serialized grant (bytes); await_import each. An
        all-or-nothing batch that fails leaves no grant open."""
        args = [self._batch_item(it, begin_import) for it in items]
        n = self._batch_size(len(args), "admit_batch", "items")
        arr = (_lib.AdmitArgs * n)(*args)
        codes = (ctypes.c_int * n)(*([-1] * n))  # -1: untouched (the call itself failed)
        infos = (_lib.RequestInfo * n)(*[_lib.new_request_info() for _ in range(n)])
        mode = _lib.HS_BATCH_ALL_OR_NOTHING if all_or_nothing else _lib.HS_BATCH_PER_ITEM
        code = self._lib.hs_admit_batch2(self._h(), n, arr, mode, codes, infos)

        def ok(i: int) -> Union[RequestInfo, bytes]:
            if args[i].flags & _lib.HS_ADMIT_IMPORT:
                return self.import_grant(args[i].request_id)
            return RequestInfo(int(infos[i].row), int(infos[i].capacity_tokens), False)

        return self._batch_outcome(code, codes, ok, lambda i: f"admit request {args[i].request_id}",
                                   f"admit batch of {n}", request_id=lambda i: int(args[i].request_id))

    @staticmethod
    def _batch_item(item: Union[Sequence[int], Dict[str, int]], begin_import: bool) -> "_lib.AdmitArgs":
        a = _lib.new_admit_args()
        if isinstance(item, dict):
            unknown = set(item) - {"request_id", "context_tokens", "token_budget", "lease_seconds", "begin_import"}
            if unknown or "request_id" not in item or "token_budget" not in item:
                raise InvalidArgument(f"admit_batch: an item dict takes request_id, token_budget, and optionally "
                                      f"context_tokens, lease_seconds, begin_import; got {sorted(item)}")
            a.request_id = int(item["request_id"])
            a.context_tokens = int(item.get("context_tokens", 0))
            a.token_budget = int(item["token_budget"])
            a.lease_seconds = int(item.get("lease_seconds", 0))
            begin_import = begin_import or bool(item.get("begin_import", False))
        else:
            t = tuple(int(v) for v in item)
            if len(t) != 3:
                raise InvalidArgument("admit_batch: each item is (request_id, context_tokens, token_budget) or a dict")
            a.request_id, a.context_tokens, a.token_budget = t
        a.flags = _lib.HS_ADMIT_IMPORT if begin_import else 0
        return a

    def park_batch(self, request_ids: Sequence[int], all_or_nothing: bool = True) -> List[Optional[HisparseError]]:
        """Parks several requests in one round trip (ABI 1.8), each as park would: one entry per
        id, None for a parked one. all_or_nothing=True raises the failing item's error with nothing
        parked (``item``, ``results`` as admit_batch's); False returns each item's error."""
        ids_list = [int(i) for i in request_ids]
        n = self._batch_size(len(ids_list), "park_batch", "ids")
        ids = (ctypes.c_uint64 * n)(*ids_list)
        codes = (ctypes.c_int * n)(*([-1] * n))
        mode = _lib.HS_BATCH_ALL_OR_NOTHING if all_or_nothing else _lib.HS_BATCH_PER_ITEM
        code = self._lib.hs_park_batch(self._h(), n, ids, mode, codes)
        return self._batch_outcome(code, codes, lambda i: None, lambda i: f"park request {ids_list[i]}",
                                   f"park batch of {n}")

    def resume_batch(self, request_ids: Sequence[int],
                     all_or_nothing: bool = True) -> List[Union[RequestInfo, HisparseError]]:
        """Resumes several parked requests in one round trip (ABI 1.8), each as resume would (its
        new row, every slot EMPTY): one entry per id, its RequestInfo or its error. all_or_nothing=
        True raises the failing item's error with every item still parked; False returns each
        item's error (ResourceExhausted: no free row, it stays parked)."""
        ids_list = [int(i) for i in request_ids]
        n = self._batch_size(len(ids_list), "resume_batch", "ids")
        ids = (ctypes.c_uint64 * n)(*ids_list)
        codes = (ctypes.c_int * n)(*([-1] * n))
        rows = (ctypes.c_uint32 * n)()
        caps = (ctypes.c_uint32 * n)()
        mode = _lib.HS_BATCH_ALL_OR_NOTHING if all_or_nothing else _lib.HS_BATCH_PER_ITEM
        code = self._lib.hs_resume_batch(self._h(), n, ids, mode, codes, rows, caps)
        return self._batch_outcome(code, codes, lambda i: RequestInfo(int(rows[i]), int(caps[i]), False),
                                   lambda i: f"resume request {ids_list[i]}", f"resume batch of {n}")

    @staticmethod
    def _batch_size(n: int, name: str, what: str) -> int:
        if not 1 <= n <= _lib.HS_BATCH_MAX_ITEMS:
            raise InvalidArgument(f"{name}: 1..{_lib.HS_BATCH_MAX_ITEMS} {what}, got {n}")
        return n

    def _batch_outcome(self, code: int, codes: Any, ok: Any, what: Any, batch: str, request_id: Any = None) -> list:
        """Each item's entry (ok(i), or its error), or raises: the call's error, or an
        all-or-nothing batch's failing item's (with ``item`` and ``results``). With request_id
        (an admission: request_id(i) names item i), the errors are AdmissionErrors."""
        n = len(codes)
        out: list = []
        for i in range(n):
            if codes[i] == _lib.HS_OK:
                out.append(ok(i))
            elif codes[i] != -1:
                err = self._item_error(codes[i], what(i))
                if request_id is not None:
                    err = admission_error_for(codes[i], err.message, request_id(i))
                out.append(err)
        try:
            if request_id is None:
                check(code, batch)
            else:
                check_admission(code, batch)
        except HisparseError as e:
            if len(out) == n:  # an item failed the batch: say which, with every item's error
                e.item = next(i for i in range(n) if codes[i] not in (_lib.HS_OK, _lib.HS_ERR_ABORTED))
                e.results = out
                if request_id is not None:
                    e.request_id = request_id(e.item)
            raise
        return out

    def release_batch(self, request_ids: Sequence[int]) -> List[Optional[HisparseError]]:
        """Releases several requests in one round trip (ABI 1.6): one entry per id, None for a
        released one, else its error (NotFound, or InvalidArgument for an id named twice); the
        others are released all the same."""
        ids_list = [int(i) for i in request_ids]
        n = len(ids_list)
        if not 1 <= n <= _lib.HS_BATCH_MAX_ITEMS:
            raise InvalidArgument(f"release_batch: 1..{_lib.HS_BATCH_MAX_ITEMS} ids, got {n}")
        ids = (ctypes.c_uint64 * n)(*ids_list)
        codes = (ctypes.c_int * n)()
        check(self._lib.hs_release_batch(self._h(), n, ids, codes), f"release batch of {n}")
        return [None if codes[i] == _lib.HS_OK else self._item_error(codes[i], f"release request {ids_list[i]}")
                for i in range(n)]

    def _item_error(self, code: int, what: str) -> HisparseError:
        name = self._lib.hs_result_string(code)
        return error_for(code, f"{what}: {name.decode() if name else f'hs_result {code}'}")
    def admit_import(self, request_id: int, context_tokens: int, token_budget: int) -> bytes:
        """Admits a request whose records a prefill node will write (docs/DESIGN.md, "Import"):
        the daemon reserves its pages and row and issues a transfer grant, returned serialized
        (hisparse.v1.ImportGrant) for the transfer agent. The request is unusable here until
        await_import sees the agent's commit."""
        self.admit(request_id, context_tokens, token_budget, begin_import=True)
        return self.import_grant(request_id)

    def import_grant(self, request_id: int) -> bytes:
        """The serialized grant (hisparse.v1.ImportGrant) of a request admitted importing and not
        yet awaited, for the transfer agent. NotFound when no import of it is pending."""
        size = ctypes.c_size_t(0)
        self._lib.hs_import_grant(self._h(), request_id, None, 0, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        check(self._lib.hs_import_grant(self._h(), request_id, buf, size.value, ctypes.byref(size)),
              f"import grant of request {request_id}")
        return buf.raw[:size.value]

    def await_import(self, request_id: int, timeout_ms: int = 10000) -> RequestInfo:
        """Waits for the import's outcome: committed, the request is installed as admit would and
        its info returned; aborted or expired, FailedPrecondition (the daemon freed it); still
        pending after timeout_ms, Unavailable."""
        ri = _lib.new_request_info()
        check(self._lib.hs_await_import(self._h(), request_id, timeout_ms, ctypes.byref(ri)),
              f"await import of request {request_id}")
        return RequestInfo(ri.row, ri.capacity_tokens, bool(ri.moved))

    def poll_evicted(self, max_ids: int = 1024) -> List[int]:
        """The ids of this session's requests the daemon evicted under pool pressure (admission's
        evict_lru_idle policy) since the last call, oldest notice first: their memory is gone and
        the engine must re-prefill or fail them. Returns at most max_ids; the rest stay queued for
        the next call. Never blocks."""
        if max_ids < 1:
            raise InvalidArgument(f"max_ids must be >= 1, got {max_ids}")
        ids = (ctypes.c_uint64 * max_ids)()
        count = ctypes.c_size_t(0)
        check(self._lib.hs_poll_evicted(self._h(), ids, max_ids, ctypes.byref(count)), "poll evicted")
        return [int(ids[i]) for i in range(count.value)]

    def info(self) -> SessionInfo:
        i = _lib.new_session_info()
        check(self._lib.hs_session_get_info(self._h(), ctypes.byref(i)), "session info")
        return SessionInfo(i.session_id, _BACKEND_NAMES.get(i.backend, str(i.backend)), i.slot_base or 0,
                           i.record_stride, i.slots, i.max_tokens_per_request, i.arena_bytes,
                           _ARENA_KIND_NAMES.get(i.arena_kind, str(i.arena_kind)), i.draft_tokens,
                           bool(i.control_lane))

    def timings(self) -> Dict[str, float]:
        """hs_session_timings (ABI 1.12): where this session's open and its slab mappings spent their
        time, in seconds (and slabs_mapped, slab_bytes_mapped as counts)."""
        t = _lib.new_session_timings()
        check(self._lib.hs_session_get_timings(self._h(), ctypes.byref(t)), "session timings")
        return {name: getattr(t, name) for name, _ in t._fields_ if name != "struct_size"}

    def stats(self) -> Stats:
        s = _lib.new_stats()
        check(self._lib.hs_stats_get(self._h(), ctypes.byref(s)), "stats")
        return Stats(s.pool_capacity_bytes, s.pool_used_bytes, s.pool_free_bytes, s.pool_fragmentation,
                     s.sessions, s.requests, s.session_requests, s.session_host_bytes, s.hits, s.misses,
                     s.bytes_fetched)

    @property
    def backend(self) -> str:
        """The backend in use: "host" or "cuda"."""
        return self._info.backend

    @property
    def session_id(self) -> int:
        return self._info.session_id

    # ---- host records and the slot arena ----

    def record_ptr(self, request_id: int, layer: int, position: int) -> int:
        """Host address (this process's mapping) of the record of (request, layer, position)."""
        out = ctypes.c_void_p()
        check(self._lib.hs_record_ptr(self._h(), request_id, layer, position, ctypes.byref(out)),
              f"record of request {request_id} layer {layer} position {position}")
        return out.value or 0

    def record_view(self, request_id: int, layer: int, position: int = 0, count: int = 1) -> Any:
        """Records [position, position + count) of (request, layer) in the host pool, as a uint8
        [count, record_bytes] numpy view (memoryview without numpy). No copy: writes land in the pool."""
        if count < 1:
            raise InvalidArgument("count must be >= 1")
        first = self.record_ptr(request_id, layer, position)
        last = self.record_ptr(request_id, layer, position + count - 1)  # checks the capacity
        if last != first + (count - 1) * self.record_bytes:
            raise FailedPrecondition("the request's records are not contiguous in this mapping")
        return host_array(first, count * self.record_bytes, (count, self.record_bytes), owner=self)

    def slot_offset(self, row: int, layer: int, slot: int) -> int:
        """Byte offset of slot `slot` of (row, layer) from slot_base (slot == slots: the newest token)."""
        return ((row * self.num_layers + layer) * self.record_slots + slot) * self._info.record_stride

    @property
    def record_slots(self) -> int:
        """Record slots of every (row, layer): B regular slots, then 1 + draft_tokens tail slots."""
        return self.slots + 1 + self.draft_tokens

    def _arena_shape(self) -> tuple:
        return (self.max_requests, self.num_layers, self.record_slots, self._info.record_stride)

    def slot_array_interface(self) -> CudaArray:
        """The CUDA slot arena as a __cuda_array_interface__ object (CuPy, Numba, torch.as_tensor)."""
        if self.backend != "cuda":
            raise FailedPrecondition("the slot arena is in host memory on the host backend: use slot_view()")
        self._h()
        return CudaArray(self._info.slot_base, self._arena_shape(), "|u1", owner=self)

    def slot_view(self) -> Any:
        """The slot arena, uint8 [max_requests, num_layers, record_slots, record_stride], without a copy:
        a torch CUDA tensor on the CUDA backend, a numpy array (or memoryview) on the host backend."""
        self._h()
        if "slots" in self._views:
            return self._views["slots"]
        if self.backend == "cuda":
            import torch
            view = torch.as_tensor(self.slot_array_interface(), device=torch.device("cuda", self.gpu))
        else:
            shape = self._arena_shape()
            nbytes = shape[0] * shape[1] * shape[2] * shape[3]
            view = host_array(self._info.slot_base, nbytes, shape, owner=self)
        self._views["slots"] = view
        return view

    # ---- data path ----

    def _data_ptr(self, obj: Any, name: str, *, int32: bool, writable: bool = False,
                  min_items: Optional[int] = None) -> int:
        p = buffer_pointer(obj, name, int32=int32, writable=writable, min_items=min_items)
        want = "cuda" if self.backend == "cuda" else "cpu"
        if p.device != want:
            raise InvalidArgument(f"{name} is in {p.device} memory; the {self.backend} backend needs "
                                  f"{'device' if want == 'cuda' else 'host'} memory")
        if want == "cuda" and p.device_index not in (-1, self.gpu):
            raise InvalidArgument(f"{name} is on cuda:{p.device_index}; the session uses cuda:{self.gpu}")
        return p.ptr

    def _stream(self, stream: Any) -> int:
        if self.backend != "cuda":
            return 0
        if stream is None:
            try:
                import torch
            except ImportError:
                return 0  # the legacy default stream
            return torch.cuda.current_stream(self.gpu).cuda_stream
        return stream_handle(stream)

    def _batch_args(self, args: Any, layer: int, rows: Any, seq_lens: Any, max_batch: Optional[int],
                    batch_size: Any) -> Any:
        """A data-path call's batch fields (resolve, prewarm): layer, max_batch (None: len(rows)),
        batch_size (None: all), rows and seq_lens, checked as int32 arrays of max_batch items."""
        if max_batch is None:
            max_batch = len(rows)
        args.layer = layer
        args.max_batch = max_batch
        args.batch_size = self._data_ptr(batch_size, "batch_size", int32=True, min_items=1) \
            if batch_size is not None else None
        args.rows = self._data_ptr(rows, "rows", int32=True, min_items=max_batch)
        args.seq_lens = self._data_ptr(seq_lens, "seq_lens", int32=True, min_items=max_batch)
        return args

    def resolve(self, layer: int, rows: Any, seq_lens: Any, positions: Any, out_slots: Any, *,
                batch_size: Any = None, max_batch: Optional[int] = None, stream: Any = None,
                page_table: Any = None, page_records: int = 1, page_offset: int = 0,
                query_counts: Any = None, programmatic: bool = False, max_blocks: int = 0,
                beside: bool = False, consumer_warps: int = 0, early_dependents: bool = False) -> None:
        """RESOLVE for one layer: afterwards out_slots[i][j] is the slot holding positions[i][j].

        rows, seq_lens: int32 [max_batch]; positions, out_slots: int32 [max_batch, k] (-1 = padding),
        [max_batch, draft_tokens + 1, k] with draft tokens: list t of row i belongs to query token
        t, position seq_len - q + t, where q = query_counts[i] (int32 [max_batch] in the kernel's
        memory, read at run time; None: 1 each); lists t >= q come back all -1.
        batch_size: None (all max_batch rows) or an int32 [1] array in the same memory read by
        the kernel at run time, so one captured CUDA graph serves every batch size; entries past
        it get -1 in every column, and so does an entry whose row is -1 (vLLM's padding). Only
        the first seq_len columns of a list are read (seq_len - q + t + 1 for list t): what the
        buffer holds past them is padding, published -1 (resolve.h, rule 10). max_batch defaults
        to len(rows). On the CUDA backend invalid rows surface at check_errors().
        page_table: None or int32 shaped like out_slots ([max_batch, k], or [max_batch,
        draft_tokens + 1, k]): also the index of each selection's record in the slot arena viewed
        as [records, record_bytes] (slot_view() flattened over rows, layers and record_slots, tail
        slots included), plus page_offset * page_records (resolve.h, rule 9); -1 where out_slots
        is -1. out_slots may then be None.
        programmatic (ABI 1.9): launch as a programmatic dependent of the previous kernel in the
        stream (compute capability 9.0+, an ordinary launch elsewhere): its launch overlaps that
        kernel's tail and it waits for that kernel before touching memory; same results, 1.0-2.2 us
        (median 1.6) less per layer on an H200 (bench/RESULTS.md). Ignored on the host backend.
        max_blocks (ABI 1.13): the most thread blocks the launch may occupy (0: the whole GPU's
        worth). For RESOLVE on a side stream beside the engine's own kernels, which then keep the
        rest of the SMs (docs/INTEGRATION.md, "Hiding the misses"); same results, a slower fetch.
        beside (ABI 1.14): launch beside the previous kernel in the stream (compute capability
        9.0+): RESOLVE runs while that kernel runs, once its blocks have asked for their dependents,
        and completes after it. That kernel must neither write this RESOLVE's inputs nor touch its
        rows or outputs (another range's sparse attention, say); hisparse.h,
        HS_RESOLVE_LAUNCH_BESIDE. Not with programmatic. Ignored on the host backend.
        consumer_warps (ABI 1.15): the warps of each of the launch's blocks that fetch queued
        chunks, 1 to 16 (0: the library's choice, more of them on a budget of max_blocks); same
        results. Ignored on the host backend.
        early_dependents (ABI 1.15): let the next kernel in the stream, launched as RESOLVE's
        programmatic dependent, start once every RESOLVE block has started (HS_RESOLVE_LAUNCH_
        EARLY_DEPENDENTS), to run beside it on the SMs max_blocks leaves; same results. Ignored on
        the host backend.
        """
        args = self._batch_args(_lib.new_resolve_args(), layer, rows, seq_lens, max_batch, batch_size)
        max_batch = args.max_batch
        lists = max_batch * (self.draft_tokens + 1) * self.k
        args.positions = self._data_ptr(positions, "positions", int32=True, min_items=lists)
        args.out_slots = self._data_ptr(out_slots, "out_slots", int32=True, writable=True,
                                        min_items=lists) if out_slots is not None else None
        if page_table is not None:
            args.page_table = self._data_ptr(page_table, "page_table", int32=True, writable=True,
                                             min_items=lists)
        args.page_records = page_records
        args.page_offset = page_offset
        args.stream = self._stream(stream) or None
        args.query_counts = self._data_ptr(query_counts, "query_counts", int32=True, min_items=max_batch) \
            if query_counts is not None else None
        args.launch_flags = (_lib.HS_RESOLVE_LAUNCH_PROGRAMMATIC if programmatic else 0) | \
            (_lib.HS_RESOLVE_LAUNCH_BESIDE if beside else 0) | \
            (_lib.HS_RESOLVE_LAUNCH_EARLY_DEPENDENTS if early_dependents else 0)  # the first two: refused
        args.max_blocks = max_blocks  # the library refuses a negative budget
        args.consumer_warps = consumer_warps  # and a count outside [0, 16]
        check(self._lib.hs_resolve(self._h(), ctypes.byref(args)), f"resolve layer {layer}")

    def prewarm(self, layer: int, rows: Any, seq_lens: Any, *, max_batch: Optional[int] = None,
                batch_size: Any = None, max_blocks: int = 0, granule_bytes: int = 0, granule_stride: int = 1,
                granule_phase: int = 0, beside: bool = False, programmatic: bool = False,
                stream: Any = None) -> None:
        """The GPU's translations of these rows' host records of `layer`, made ahead of its resolve() (ABI 1.19).

        One 16-byte read in every granule_bytes (0: 64 KiB) of positions [0, seq_lens[i]) of each
        row's records; nothing is written, so it may run beside anything. It pays only off the step's
        path and close before that layer's resolve(), which then fetches at its warm speed on a host
        where warm reads of host memory beat cold ones; the example engine's step has no such place
        (docs/INTEGRATION.md, "Hiding the misses"). rows (-1 pads), seq_lens and batch_size as
        resolve() takes them; max_blocks: thread blocks to read with (0: an eighth of the SMs);
        granule_stride / granule_phase: read only the granules g with g % stride == phase (a share
        that fits beside the kernel it runs with); beside: launched beside the kernel before it in
        the stream, completing after it (HS_RESOLVE_LAUNCH_BESIDE; that kernel must ask for its
        dependents), programmatic: as its programmatic dependent. Bad rows surface at check_errors()
        on the CUDA backend, at once on the host backend.
        """
        args = self._batch_args(_lib.new_prewarm_args(), layer, rows, seq_lens, max_batch, batch_size)
        args.max_blocks = max_blocks
        args.granule_bytes = granule_bytes
        args.granule_stride = granule_stride
        args.granule_phase = granule_phase
        args.launch_flags = (_lib.HS_RESOLVE_LAUNCH_BESIDE if beside else 0) | \
            (_lib.HS_RESOLVE_LAUNCH_PROGRAMMATIC if programmatic else 0)  # both: refused
        args.stream = self._stream(stream) or None
        check(self._lib.hs_prewarm(self._h(), ctypes.byref(args)), f"prewarm layer {layer}")

    def prefetch(self, layer: int, *, stream: Any = None) -> None:
        """Exact prefetch of a layer that shares its anchor's selection (layer_anchor at open).

        Replays the miss plan of the anchor's last resolve() into `layer` (its own records, the
        same slots); `layer`'s tables end exactly as a resolve() of it with the anchor's arguments
        would leave them, and the anchor's out_slots serve it. Run it on a side stream that waits
        for the anchor's resolve (an event), and make the layer's append and attention wait for it.
        """
        check(self._lib.hs_prefetch(self._h(), layer, self._stream(stream) or None), f"prefetch layer {layer}")

    def store(self, request_id: int, src: Any, *, start_pos: int = 0, num_tokens: Optional[int] = None,
              seq_len_after: Optional[int] = None, layer_stride: Optional[int] = None,
              token_stride: Optional[int] = None, stream: Any = None) -> None:
        """Prefill store of tokens [start_pos, start_pos + num_tokens), every layer.

        Record of (layer l, token t) is read at src + l*layer_stride + t*token_stride (bytes). With
        a 3-D torch tensor [num_layers, tokens, record] the strides and num_tokens default from its
        shape and strides (a slice of a larger cache works); otherwise token_stride defaults to
        record_bytes and layer_stride to num_tokens * token_stride. seq_len_after defaults to
        start_pos + num_tokens.
        """
        if _is_torch_tensor(src) and src.dim() == 3:
            tokens, ts, ls, ptr = self._layered(src, self.num_layers, f"[{self.num_layers}, tokens, ")
            num_tokens = tokens if num_tokens is None else num_tokens
            token_stride = ts if token_stride is None else token_stride
            layer_stride = ls if layer_stride is None else layer_stride
        else:
            if num_tokens is None:
                raise InvalidArgument("num_tokens is required unless src is a [num_layers, tokens, record] tensor")
            token_stride = self.record_bytes if token_stride is None else token_stride
            layer_stride = num_tokens * token_stride if layer_stride is None else layer_stride
            need = 0 if num_tokens == 0 else \
                (self.num_layers - 1) * layer_stride + (num_tokens - 1) * token_stride + self.record_bytes
            ptr = self._data_ptr(src, "src", int32=False, min_items=need)
        if seq_len_after is None:
            seq_len_after = start_pos + num_tokens
        check(self._lib.hs_store(self._h(), request_id, start_pos, num_tokens, seq_len_after, ptr, layer_stride,
                                 token_stride, self._stream(stream) or None),
              f"store request {request_id}")

    def store_indexed(self, request_id: int, src: Any, src_index: Any, *, start_pos: int = 0,
                      num_tokens: Optional[int] = None, seq_len_after: Optional[int] = None,
                      first_layer: int = 0, num_layers: Optional[int] = None,
                      src_tokens: Optional[int] = None, layer_stride: Optional[int] = None,
                      token_stride: Optional[int] = None, stream: Any = None) -> None:
        """Indexed prefill store (hs_store_indexed): tokens [start_pos, start_pos + num_tokens) of
        layers [first_layer, first_layer + num_layers), gathered from a paged KV pool in one launch.

        Record of (layer first_layer + l, token t) is read at
        src + l*layer_stride + src_index[t]*token_stride (bytes); src_index is int32 [num_tokens]
        (the pool slot of each token, in the backend's memory). With a 3-D torch tensor src
        [layers, pool_tokens, record] (the pool from layer first_layer on) src_tokens and the
        strides default from its shape and strides; otherwise src_tokens, layer_stride (unless
        num_layers is 1) are required and token_stride defaults to record_bytes. num_tokens
        defaults to len(src_index), num_layers to every layer from first_layer, seq_len_after to
        start_pos + num_tokens. On the CUDA backend a src_index entry outside [0, src_tokens)
        surfaces at check_errors() (nothing is written); everything else raises at once.
        """
        if num_tokens is None:
            num_tokens = len(src_index)
        if num_layers is None:
            num_layers = self.num_layers - first_layer
        if _is_torch_tensor(src) and src.dim() == 3:
            tokens, ts, ls, ptr = self._layered(src, num_layers, f"[>= {num_layers}, pool tokens, ")
            src_tokens = tokens if src_tokens is None else src_tokens
            token_stride = ts if token_stride is None else token_stride
            layer_stride = ls if layer_stride is None else layer_stride
        else:
            if src_tokens is None:
                raise InvalidArgument("src_tokens is required unless src is a [layers, pool tokens, record] tensor")
            if layer_stride is None and num_layers > 1:
                raise InvalidArgument("layer_stride is required for more than one layer unless src is a 3-D tensor")
            token_stride = self.record_bytes if token_stride is None else token_stride
            layer_stride = 0 if layer_stride is None else layer_stride
            need = 0 if num_tokens == 0 or src_tokens < 1 else \
                max(0, num_layers - 1) * layer_stride + (src_tokens - 1) * token_stride + self.record_bytes
            ptr = self._data_ptr(src, "src", int32=False, min_items=need)
        args = _lib.new_store_indexed_args()
        args.request_id = request_id
        args.first_layer = first_layer
        args.num_layers = num_layers
        args.start_pos = start_pos
        args.num_tokens = num_tokens
        args.seq_len_after = start_pos + num_tokens if seq_len_after is None else seq_len_after
        args.src_base = ptr
        args.src_index = self._data_ptr(src_index, "src_index", int32=True, min_items=num_tokens) \
            if num_tokens > 0 else None
        args.src_tokens = src_tokens
        args.src_layer_stride = layer_stride
        args.src_token_stride = token_stride
        args.stream = self._stream(stream) or None
        check(self._lib.hs_store_indexed(self._h(), ctypes.byref(args)), f"indexed store request {request_id}")

    def _layered(self, src: Any, layers: int, need: str) -> tuple:
        """A 3-D torch tensor [layers, tokens, record] as (tokens, token_stride, layer_stride, address);
        `need` starts the error message's expected shape."""
        elem = src.element_size()
        if src.shape[0] < layers or src.shape[2] * elem < self.record_bytes:
            raise InvalidArgument(f"src has shape {tuple(src.shape)}; need {need}record of >= {self.record_bytes} bytes]")
        return int(src.shape[1]), src.stride(1) * elem, src.stride(0) * elem, self._strided_ptr(src, "src")

    def _strided_ptr(self, t: Any, name: str) -> int:
        """Address of a (possibly non-contiguous) torch tensor, checked for device like _data_ptr."""
        want = "cuda" if self.backend == "cuda" else "cpu"
        if t.device.type != want:
            raise InvalidArgument(f"{name} is in {t.device.type} memory; the {self.backend} backend needs "
                                  f"{'device' if want == 'cuda' else 'host'} memory")
        if want == "cuda" and t.device.index != self.gpu:
            raise InvalidArgument(f"{name} is on {t.device}; the session uses cuda:{self.gpu}")
        return t.data_ptr()

    def append(self, layer: int, rows: Any, seq_lens: Any, src: Any, *, batch_size: Any = None,
               max_batch: Optional[int] = None, src_stride: Optional[int] = None, stream: Any = None,
               token_counts: Any = None) -> None:
        """Decode append of one layer: the newest token (position seq_len - 1) of every row, into the
        host pool and the row's newest-token slot. Record of batch entry i at src + i*src_stride;
        src_stride defaults to the row stride of a 2-D torch tensor, else record_bytes. The kernel lets
        a kernel launched as its programmatic dependent start at once (ABI 1.18), so an engine's
        indexer can run beside it (docs/INTEGRATION.md, "The append beside the indexer").

        With draft tokens, token_counts (int32 [max_batch], read at run time) gives the q newest
        tokens of each row (1..draft_tokens + 1): token t is position seq_len - q + t, goes to tail
        slot B + t, and its record is record i * (draft_tokens + 1) + t of src."""
        if max_batch is None:
            max_batch = len(rows)
        records = max_batch * (self.draft_tokens + 1) if token_counts is not None else max_batch
        if _is_torch_tensor(src) and src.dim() == 2:
            if src.shape[0] < records or src.shape[1] * src.element_size() < self.record_bytes:
                raise InvalidArgument(f"src has shape {tuple(src.shape)}; need [>= {records}, record of "
                                      f">= {self.record_bytes} bytes]")
            src_stride = src.stride(0) * src.element_size() if src_stride is None else src_stride
            src_ptr = self._strided_ptr(src, "src")
        else:
            src_stride = self.record_bytes if src_stride is None else src_stride
            need = 0 if records == 0 else (records - 1) * src_stride + self.record_bytes
            src_ptr = self._data_ptr(src, "src", int32=False, min_items=need)
        bs = self._data_ptr(batch_size, "batch_size", int32=True, min_items=1) if batch_size is not None else None
        rows_ptr = self._data_ptr(rows, "rows", int32=True, min_items=max_batch)
        seq_ptr = self._data_ptr(seq_lens, "seq_lens", int32=True, min_items=max_batch)
        if token_counts is None:
            check(self._lib.hs_append(self._h(), layer, max_batch, bs, rows_ptr, seq_ptr, src_ptr, src_stride,
                                      self._stream(stream) or None), f"append layer {layer}")
            return
        counts = self._data_ptr(token_counts, "token_counts", int32=True, min_items=max_batch)
        check(self._lib.hs_append_tokens(self._h(), layer, max_batch, bs, rows_ptr, seq_ptr, counts, src_ptr,
                                         src_stride, self._stream(stream) or None), f"append layer {layer}")

    def check_errors(self) -> None:
        """Raises InvalidArgument for bad data-path input that kernels flagged since the last call.
        Synchronizes the device: never call it inside CUDA-graph capture."""
        check(self._lib.hs_check_errors(self._h()), "data path")
