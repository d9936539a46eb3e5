"""Memory: peak process RSS, a tensor-level breakdown by category, and CUDA allocator peaks.

Three views, because none is enough alone (probe scripts on a 2-core avx512_bf16 machine, torch 2.13 CPU):

- RSS is what the OS sees. About 220 MB of it is ``import torch``, and it shows only about half of a tensor-level
  saving (the CPU allocator keeps freed pages), but it is the only view that sees inside torch.compile graphs.
- ``TensorMemoryTracker`` counts live tensor storages by category (params / grads / optimizer / activations /
  other) under a ``TorchDispatchMode``. It is exactly repeatable and works when the model is called several times
  per step (gradient accumulation), which torch's own ``MemTracker`` refuses; it costs 10-15% of step time, so it
  runs in its own pass, never inside the timed window.
- On CUDA, ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved``.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import threading
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten

log = logging.getLogger(__name__)

# ---- process RSS --------------------------------------------------------------------------------------------------


def _read_status_bytes(field_name: str, status: Path = Path("/proc/self/status")) -> int | None:
    try:
        for line in status.read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) * 1024  # the kernel reports kB
    except (OSError, ValueError, IndexError):
        return None
    return None


class PeakRss:
    """Peak resident set size of this process since the last ``reset()``.

    On Linux the kernel keeps the peak (VmHWM) and resets it when "5" is written to ``/proc/self/clear_refs``, so
    the peak can cover the timed steps only (after warm-up). Where that is not possible (other OS, restricted
    /proc) a background thread samples RSS every ``interval_s``; it can miss spikes shorter than the interval.
    """

    CLEAR_REFS = Path("/proc/self/clear_refs")

    def __init__(self, interval_s: float = 0.005) -> None:
        self.interval_s = interval_s
        self.method: str | None = None  # "clear_refs" or "sampling", set by reset()
        self._proc = psutil.Process()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._sampled_max = 0

    def rss_bytes(self) -> int:
        """Current RSS."""
        return int(self._proc.memory_info().rss)

    def reset(self) -> None:
        """Make the peak start from the current RSS."""
        self.close()
        try:
            self.CLEAR_REFS.write_text("5")
            if _read_status_bytes("VmHWM") is None:
                raise OSError("no VmHWM in /proc/self/status")
            self.method = "clear_refs"
            return
        except OSError as exc:
            log.info("cannot reset the kernel's peak RSS (%s); sampling RSS every %.0f ms instead", exc,
                     self.interval_s * 1000)
        self.method = "sampling"
        self._sampled_max = self.rss_bytes()
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample, name="PeakRss-sampler", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sampled_max = max(self._sampled_max, self.rss_bytes())

    def peak_bytes(self) -> int:
        """Peak RSS since ``reset()`` (since process start if never reset)."""
        if self.method == "sampling":
            return max(self._sampled_max, self.rss_bytes())
        hwm = _read_status_bytes("VmHWM")
        return hwm if hwm is not None else self.rss_bytes()

    def close(self) -> None:
        """Stop the sampling thread, if any."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None


# ---- glibc malloc: make freed memory show in RSS ------------------------------------------------------------------

# mallopt() parameters, from glibc's <malloc.h>.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
CLEAN_MMAP_THRESHOLD = 64 * 1024


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - only glibc has it; musl and macOS raise AttributeError here
    except (OSError, AttributeError):
        return None
    return libc


def return_freed_memory_to_os() -> str | None:
    """Make glibc hand freed blocks back to the OS at once, so RSS follows live memory; None, or why not.

    By default glibc keeps freed memory for reuse: its mmap threshold grows to the largest block freed (up to
    32 MiB on 64-bit), so after the first step most tensors come from the heap, and the heap shrinks only when
    128 KiB are free at its top. RSS then shows the largest footprint seen so far, not what is live (a test here:
    all 152 MB of freed, fragmented 400 KB tensors stayed resident). With a fixed 64 KiB mmap threshold every
    tensor of 64 KiB or more gets its own mapping, unmapped on free, and a zero trim threshold returns the heap's
    free top. The price: a page fault per
    fresh page, which doubled the step time of the tiny workloads here (gpt:tiny 11.8 -> 21.5 ms), so trials set
    this only for the memory pass after the timed window, never while timing. A fixed threshold also stops glibc's
    dynamic adjustment for the rest of the process, which is why the pass comes last.
    """
    libc = _glibc()
    if libc is None:
        return "not glibc: cannot set malloc thresholds, RSS keeps freed memory"
    if not (libc.mallopt(M_MMAP_THRESHOLD, CLEAN_MMAP_THRESHOLD) and libc.mallopt(M_TRIM_THRESHOLD, 0)):
        return "mallopt refused the thresholds"
    trim_heap()
    return None


def trim_heap() -> None:
    """Collect garbage and return glibc's free heap memory to the OS (``malloc_trim(0)``); a no-op elsewhere."""
    gc.collect()
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


# ---- CUDA allocator peaks -----------------------------------------------------------------------------------------


def cuda_peak_reset(device: torch.device | str) -> None:
    """Reset the CUDA allocator's peak statistics; a no-op on other devices."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def cuda_peak_bytes(device: torch.device | str) -> dict[str, int] | None:
    """``{"allocated": max_memory_allocated, "reserved": max_memory_reserved}`` since the last reset; None off CUDA."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return {
        "allocated": int(torch.cuda.max_memory_allocated(device)),
        "reserved": int(torch.cuda.max_memory_reserved(device)),
    }


# ---- tensor breakdown ---------------------------------------------------------------------------------------------

CATEGORIES = ("params", "grads", "optimizer", "activations", "other")
EXTERNAL = "external"  # existed before entering, seen only through a view or in-place op: never counted

# What an op's outputs are: new storages, views of inputs, or inputs written in place (from the op's schema).
FRESH, VIEW, WRITE = 0, 1, 2
# lift_fresh aliases its input by schema, but it hands over a tensor created just before outside the dispatcher
# (``torch.tensor(...)`` inside the mode, e.g. AdamW's ``step``): a new storage.
_FRESH = {torch.ops.aten.lift_fresh.default}


_OP_KIND: dict[Any, int] = {}  # cache: parsing a schema costs more than the op's bookkeeping


def _op_kind(func: Any) -> int:
    kind = _OP_KIND.get(func)
    if kind is None:
        kind = _OP_KIND[func] = _schema_kind(func)
    return kind


def _schema_kind(func: Any) -> int:
    if func in _FRESH:
        return FRESH
    schema = getattr(func, "_schema", None)
    aliases = [r.alias_info for r in schema.returns if r.alias_info is not None] if schema is not None else []
    if not aliases:
        return FRESH
    return WRITE if any(a.is_write for a in aliases) else VIEW


@dataclass
class MemoryBreakdown:
    """Live tensor bytes at the moment of the peak of their total, by category.

    ``params`` includes buffers (BatchNorm statistics): the model's state. ``activations`` are storages created
    while grad mode is on: the forward pass, including the forward that activation checkpointing recomputes during
    backward (and the scalar seed gradient of ``loss.backward()``); ``other`` are storages created with grad mode
    off: temporaries of backward and of the optimizer step, and anything under ``torch.no_grad()``. Gradients and
    optimizer state are re-classified as such whatever they were created as. ``activation_peak_bytes`` is the largest
    amount of live activations at any moment, which need not coincide with the total's peak. ``held`` names the parts
    of ``other`` that techniques keep resident beside the model (a distillation teacher, a reference policy, a reward
    model: ``Technique.held_parts``), each with its bytes.
    """

    peak_bytes: int
    params: int
    grads: int
    optimizer: int
    activations: int
    other: int
    activation_peak_bytes: int
    held: dict[str, int] = field(default_factory=dict)


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _storages(t: torch.Tensor) -> list[torch.UntypedStorage]:
    """The storages behind a tensor, looking through wrapper subclasses (DTensor and the like)."""
    if type(t) in _PLAIN and not t.is_meta and t.layout == torch.strided:
        return [t.untyped_storage()]  # the hot path: called for every op output
    todo, out = [t], []
    while todo:
        x = todo.pop()
        if is_traceable_wrapper_subclass(x):
            attrs, _ = x.__tensor_flatten__()
            todo.extend(v for v in (getattr(x, a) for a in attrs) if isinstance(v, torch.Tensor))
            continue
        if x.is_meta or x.layout != torch.strided:
            continue  # no real memory (meta) or no single storage (sparse): not tracked
        try:
            out.append(x.untyped_storage())
        except (RuntimeError, NotImplementedError):
            continue
    return out


def _unique_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the storages behind ``tensors``, each storage once."""
    seen: dict[int, int] = {}
    for t in tensors:
        for st in _storages(t):
            seen[id(st)] = st.nbytes()
    return sum(seen.values())


class TensorMemoryTracker(TorchDispatchMode):
    """Tracks live tensor storages by category during ``with tracker: ...`` and reports the peak.

    Each storage is counted once (views share it) and freed when its Python storage object is finalised (a weak
    reference callback). Parameters, buffers, existing gradients and existing optimizer state are counted from the
    start. Categories are decided when a storage is created and corrected later: a storage that becomes a ``.grad``
    (post-accumulate-grad hook) or optimizer state (optimizer step hook, and again at exit) is re-classified, and the
    composition at the peak uses those final categories, so AdamW's first-step state and gradients produced by
    backward land in ``optimizer`` and ``grads`` rather than ``other``.

    To report the composition at the peak without copying the live set at every new maximum, every allocation and
    free is appended to an event log; the index at the peak is kept and the log is replayed once in ``result()``.

    Limits: ops inside a torch.compile'd graph are not dispatched through Python, so their intermediate tensors are
    invisible (use RSS or the CUDA allocator peak for compiled configurations). The input batch created before
    entering is not counted (torch's MemTracker counts a module's inputs, so its peak is higher by the batch's
    bytes); a batch copied to the device inside the step is counted, as an activation. ``UntypedStorage.resize_``
    called directly (FSDP does this) is not seen. Bytes are storage sizes, not allocator block sizes (CUDA rounds
    allocations up to 512 bytes).

    Cost: every op goes through Python, roughly 10-20 us of torch's own dispatch-mode overhead plus about as much
    bookkeeping here, so a step made of many small ops slows down most (2x for the tiny CI CNN, ~1.2x for a
    0.5 s MLP step); measure memory in its own pass, never inside a timed window. The first dispatch mode entered
    in a process imports parts of torch._dynamo (seconds).
    """

    def __init__(self, model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None,
                 held: Mapping[str, Iterable[torch.Tensor]] | None = None) -> None:
        super().__init__()
        self.model = model
        self.optimizer = optimizer
        # kept resident beside the model (a distillation teacher, a reference policy), by name: "other" from the start
        self.held = {name: list(ts) for name, ts in (held or {}).items()}
        self._reset_state()

    def _reset_state(self) -> None:
        # Storages are keyed by id() of their Python object: torch keeps that object alive exactly as long as the
        # storage (PyObject preservation), and the weak reference's callback forgets the id before it can be reused.
        # (A WeakIdKeyDictionary does the same but costs a wrapper object per lookup, on every op.)
        self._key_by_id: dict[int, int] = {}
        self._refs: dict[int, weakref.ref] = {}  # key -> weak reference whose callback records the free
        self._nbytes: dict[int, int] = {}
        self._category: dict[int, str] = {}
        self._initial: list[int] = []  # keys live at entry
        self._log: list[int] = []  # +key = allocated, -key = freed (keys start at 1)
        self._next_key = 1
        self._total = 0
        self._peak = 0
        self._peak_index = 0  # the live set at the peak is initial + log[:peak_index]
        self._act_live = 0
        self._act_peak = 0
        self._active = False
        self._hooks: list[Any] = []
        self._result: MemoryBreakdown | None = None

    # -- bookkeeping (no lock: ops of one step run on one thread at a time, even when autograd runs backward on a
    # device thread on CUDA while the caller blocks; weak reference callbacks run on the thread that drops the
    # last reference)

    def _track(self, t: torch.Tensor, category: str, initial: bool = False, kind: int = FRESH) -> None:
        for st in _storages(t):
            key = self._key_by_id.get(id(st))
            if key is not None:
                if kind == VIEW or self._category[key] == EXTERNAL:
                    continue  # a view cannot change its storage's size; in-place writes and out= can
                nbytes = st.nbytes()
                if nbytes != self._nbytes[key]:  # resized in place (resize_, out= variants)
                    self._alloc(nbytes - self._nbytes[key], self._category[key], log_key=None)
                    self._nbytes[key] = nbytes
                continue
            key = self._next_key
            self._next_key += 1
            sid = id(st)
            try:
                self._refs[key] = weakref.ref(st, self._make_free_callback(key, sid))
            except TypeError:
                log.warning("a storage cannot be weakly referenced; it is not tracked")
                continue
            self._key_by_id[sid] = key
            if kind != FRESH:
                # A view of (or an in-place write into) a tensor that existed before entering but is not model or
                # optimizer state, such as the input batch: remembered so it is never counted.
                self._category[key] = EXTERNAL
                self._nbytes[key] = 0
                continue
            nbytes = st.nbytes()
            self._nbytes[key] = nbytes
            self._category[key] = category
            if initial:
                self._initial.append(key)
                self._total += nbytes
                self._peak = max(self._peak, self._total)
            else:
                self._alloc(nbytes, category, log_key=key)

    def _alloc(self, nbytes: int, category: str, log_key: int | None) -> None:
        if log_key is not None:
            self._log.append(log_key)
        self._total += nbytes
        if category == "activations":
            self._act_live += nbytes
            if self._act_live > self._act_peak:
                self._act_peak = self._act_live
        if self._total > self._peak:
            self._peak = self._total
            self._peak_index = len(self._log)

    def _make_free_callback(self, key: int, sid: int):
        def freed(_ref: weakref.ref) -> None:
            if self._key_by_id.get(sid) == key:
                del self._key_by_id[sid]
            if not self._active or self._refs.pop(key, None) is None:
                return
            nbytes = self._nbytes[key]
            if nbytes == 0 and self._category[key] == EXTERNAL:
                return
            self._log.append(-key)
            self._total -= nbytes
            if self._category[key] == "activations":
                self._act_live -= nbytes

        return freed

    def _reclassify(self, t: torch.Tensor | None, category: str) -> None:
        if t is None:
            return
        for st in _storages(t):
            key = self._key_by_id.get(id(st))
            if key is None:
                continue
            old = self._category[key]
            if old != category and old != EXTERNAL and key in self._refs:
                if old == "activations":
                    self._act_live -= self._nbytes[key]
                self._category[key] = category

    def _optimizer_tensors(self) -> list[torch.Tensor]:
        if self.optimizer is None:
            return []
        out = []
        for state in self.optimizer.state.values():
            values = state.values() if isinstance(state, dict) else [state]
            for v in values:
                flat, _ = tree_flatten(v)
                out.extend(x for x in flat if isinstance(x, torch.Tensor))
        return out

    def _params(self) -> list[torch.nn.Parameter]:
        params: list[torch.Tensor] = []
        if self.model is not None:
            params.extend(self.model.parameters())
        if self.optimizer is not None:
            params.extend(p for g in self.optimizer.param_groups for p in g["params"])
        return params

    def _mark_state(self) -> None:
        for p in self._params():
            self._reclassify(p.grad, "grads")
        for t in self._optimizer_tensors():
            self._reclassify(t, "optimizer")

    # -- the dispatch mode

    def __enter__(self) -> TensorMemoryTracker:
        self._reset_state()
        self._active = True
        if self.model is not None:
            for b in self.model.buffers():
                self._track(b, "params", initial=True)
        seen: set[int] = set()
        for p in self._params():
            if id(p) in seen:
                continue
            seen.add(id(p))
            self._track(p, "params", initial=True)
            if p.grad is not None:
                self._track(p.grad, "grads", initial=True)
            if p.requires_grad:
                # Marks gradients as they land in .grad, so a gradient freed before exit (zero_grad at the end of
                # a step) is still counted as a gradient in the composition at the peak.
                self._hooks.append(p.register_post_accumulate_grad_hook(lambda q: self._reclassify(q.grad, "grads")))
        for t in self._optimizer_tensors():
            self._track(t, "optimizer", initial=True)
        for ts in self.held.values():
            for t in ts:
                self._track(t, "other", initial=True)
        if self.optimizer is not None:
            self._hooks.append(self.optimizer.register_step_post_hook(lambda *_: self._mark_state()))
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self._mark_state()
            for h in self._hooks:
                h.remove()
            self._result = self._compose()
            self._active = False
            self._refs.clear()  # drops the weak references: no callbacks after exit

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # Grad mode tells the forward pass from the rest: autograd runs backward with grad mode off (unless
        # create_graph=True), optimizer.step and evaluation run under no_grad. Activation checkpointing recomputes
        # the forward *inside* backward with grad mode on: those recomputed tensors are activations too.
        category = "activations" if torch.is_grad_enabled() else "other"
        kind = _op_kind(func)
        if isinstance(out, torch.Tensor):
            self._track(out, category, kind=kind)
        elif isinstance(out, (tuple, list)):  # anything else (a Python scalar from .item(), None) holds no storage
            for t in out:
                if isinstance(t, torch.Tensor):
                    self._track(t, category, kind=kind)
                elif isinstance(t, (tuple, list)):  # e.g. the lists of tensors _foreach ops return
                    for u in tree_flatten(t)[0]:
                        if isinstance(u, torch.Tensor):
                            self._track(u, category, kind=kind)
        return out

    # -- results

    def _compose(self) -> MemoryBreakdown:
        live = set(self._initial)
        for k in self._log[: self._peak_index]:
            if k > 0:
                live.add(k)
            else:
                live.discard(-k)
        by_cat = dict.fromkeys(CATEGORIES, 0)
        for k in live:
            cat = self._category[k]
            if cat in by_cat:
                by_cat[cat] += self._nbytes[k]
        total = sum(by_cat.values())
        if total != self._peak:
            # Only an in-place resize between creation and the peak could make these differ.
            log.debug("tracker peak %d differs from the replayed composition %d", self._peak, total)
        return MemoryBreakdown(peak_bytes=self._peak, activation_peak_bytes=self._act_peak, **by_cat,
                               held={name: _unique_bytes(ts) for name, ts in self.held.items()})

    def result(self) -> MemoryBreakdown:
        """The breakdown of the last ``with`` block."""
        if self._result is None:
            raise RuntimeError("TensorMemoryTracker.result() called before a `with tracker:` block ended")
        return self._result
