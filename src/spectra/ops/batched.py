"""Apply a batched matrix operator to a list of matrices of mixed shapes, in place."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from spectra.ops._common import side_by_side

#: ``max_elements=None`` caps a batch at ``total / BATCH_FRACTION`` elements (but at least
#: ``MIN_BATCH``, below; or one matrix, if larger): the operators' float64 temporaries are
#: several times their batch, and this keeps them at a small fraction of all the matrices.
BATCH_FRACTION = 32
#: The same for operators with products only (``op.matmul_only(X)``, the matmul-only soft
#: clips), whose products run faster on larger batches; on the CPU their batches run one after
#: another with the intra-op threads. Their temporaries are a few ``m × m`` matrices per matrix
#: (``m ≤ n``), up to seven times a batch of square matrices, so the fraction sets the GPU
#: step's peak: at the 124M shapes the CPU's model of it (:mod:`spectra_lab.bench.live_bytes`)
#: gave 1.17× torch AdamW's peak at 1/8, 1.09× at 1/16 (with the waves below at 1/16) and
#: 1.05× at 1/32. Smaller batches cost launches on a GPU: 1/16 is the largest within 1.10×.
#: (The main job's optimizer step took 92 ms at 1/32 and 75 ms at 1/8 on a 2-core CPU with
#: bf16 units, docs/operators.md; its batches sit at the floor below.)
MATMUL_BATCH_FRACTION = 16
#: ...but never below this many elements (4 MiB of float32): each batch also runs about a
#: hundred small operations on its per-matrix scalars and temporaries, which outweigh what a
#: smaller batch saves in memory. The main job's optimizer step took 35.5 ms with nine batches
#: of 1/8 and 30.8 ms with three at this floor (two threads, a CPU with bf16 units;
#: experiments/batch_floor_ab.py).
MATMUL_MIN_BATCH = 2**20
#: The other ops' batches are never below this many elements (1 MiB of float32) either: on
#: the CPU a batch runs side by side with the others only while it fits ``cap / threads``, so
#: with a cap of 1/32 of a small step every matrix ran alone, one after another. The main job's
#: 28 eigendecompositions of 192 × 192 then ran serially; with this floor they run in batches of
#: three on two threads (experiments/clip_method_step.py, docs/operators.md).
MIN_BATCH = 2**18
#: The deferred batches of a call (off the CPU) wait for their host read holding their pending
#: state, about ``2·min(m, n)²`` numbers a matrix for the polar methods (G and G²): up to twice
#: the matrices themselves, which made the GPU step's peak 1.58× torch AdamW's on an H200. A
#: call reads in waves whose pending state stays within the elements of all its matrices over
#: this fraction (one read a wave; the first wave also reads ``finite``): at 1/4 the pending
#: Gram matrices set the peak once the batches were 1/16 (1.11× against 1.09× at 1/16 in the
#: model above)...
PENDING_FRACTION = 16
#: ...but at least this many elements (16 MiB of float32), so that a small model's step still
#: reads once.
PENDING_MIN = 2**22


def _batch_indices(mats: Sequence[Tensor], max_elements: int) -> list[list[int]]:
    """Positions of same-shaped, same-dtype, same-device matrices in runs of at most
    ``max_elements`` elements (at least one matrix each), in order."""
    groups: dict[tuple, list[int]] = {}
    for i, X in enumerate(mats):
        groups.setdefault((tuple(X.shape), X.dtype, X.device), []).append(i)
    out = []
    for (shape, _, _), group in groups.items():
        per_batch = max(1, max_elements // max(1, shape[0] * shape[1]))
        out += [group[i : i + per_batch] for i in range(0, len(group), per_batch)]
    return out


def _batches(mats: list[Tensor], max_elements: int) -> list[list[Tensor]]:
    return [[mats[i] for i in batch] for batch in _batch_indices(mats, max_elements)]


def _cap(products: bool, max_elements: int | None, total: int) -> int:
    """The batch cap of an op (``products``: a matmul-only one) in a call of ``total``
    elements."""
    if max_elements is not None:
        return max_elements
    if products:
        return max(MATMUL_MIN_BATCH, -(-total // MATMUL_BATCH_FRACTION))
    return max(MIN_BATCH, -(-total // BATCH_FRACTION))


def _products(op: Callable, mats: Sequence[Tensor]) -> bool:
    matmul_only = getattr(op, "matmul_only", None)
    return len(mats) > 0 and matmul_only is not None and matmul_only(mats[0])


def batch_indices(
    jobs: Sequence[tuple[Callable[[Tensor], Tensor], Sequence[Tensor]]],
    *,
    max_elements: int | None = None,
) -> list[tuple[int, list[int]]]:
    """The batches :func:`batched_apply_all_` forms for ``jobs``: ``(job, positions)`` pairs.

    A call on a subset of the matrices made of whole batches, given ``total`` (the elements of
    all of them), forms the same batches: replicated runs divide batches among their ranks
    this way (:func:`spectra.optim.replicated.apply_replicated`), so that each matrix meets the
    same batch-mates, and so the same iteration, as in one process.
    """
    total = sum(X.numel() for _, mats in jobs for X in mats)
    return [
        (j, batch)
        for j, (op, mats) in enumerate(jobs)
        for batch in _batch_indices(mats, _cap(_products(op, mats), max_elements, total))
    ]


def batched_apply_(
    op: Callable[[Tensor], Tensor],
    matrices: Sequence[Tensor],
    *,
    max_elements: int | None = None,
) -> None:
    r"""``X ← op(X)`` for every matrix, with one ``op`` call per batch of same-shaped matrices.

    ``op`` maps a ``(B, m, n)`` batch to a tensor of the same shape (any operator of
    :mod:`spectra.ops`). Matrices that share shape, dtype and device are stacked into batches of
    at most ``max_elements`` elements (at least one matrix each; ``None``: the elements of all
    the call's matrices over :data:`BATCH_FRACTION` but at least :data:`MIN_BATCH`, or for an
    ``op`` whose ``matmul_only(X)``
    is true over :data:`MATMUL_BATCH_FRACTION` but at least :data:`MATMUL_MIN_BATCH`) and the
    results are copied back. The transient memory of a call is one batch, its stack and
    ``op``'s own temporaries (off the CPU, see :func:`batched_apply_all_`).

    On the CPU with ``T = torch.get_num_threads() > 1``, batches of at most ``max_elements / T``
    elements run side by side on ``T`` Python threads, each with one intra-op thread, so the
    elements in flight stay within ``max_elements``. A matrix larger than ``max_elements / T``
    runs alone, on the calling thread with its intra-op threads, before the others: at most one
    such matrix and its temporaries are alive at a time, as with one thread. The exact operators
    spend most of their time in LAPACK's symmetric eigensolver, which gains little from
    intra-op threads at these sizes; running batches side by side is what uses the cores
    (docs/operators.md). Each batch is computed on one thread, so results do not depend on the
    scheduling. The thread count is process-wide: other torch work in the process runs
    single-threaded meanwhile. The batches of a matmul-only ``op`` run one after another, each
    with the intra-op threads, which its products use. A call with a single batch, and every
    call while the PyTorch profiler is on, runs on the calling thread (where the profiler sees
    it) with its threads.
    """
    batched_apply_all_([(op, matrices)], max_elements=max_elements)


def batched_apply_all_(
    jobs: Sequence[tuple[Callable[[Tensor], Tensor], Sequence[Tensor]]],
    *,
    max_elements: int | None = None,
    finite: Tensor | None = None,
    total: int | None = None,
    max_pending: int | None = None,
) -> bool:
    r"""``X ← op(X)`` for every ``(op, matrices)`` job, each batched as by
    :func:`batched_apply_`, with one host read for all the operators that need one (per wave
    of ``max_pending`` elements of pending state).

    An ``op`` whose ``deferred(X)`` is true for a batch's matrices (such as
    :class:`spectra.optim.chain.SpectralOp` for a soft clip by ``"polar"`` or ``"mixed"``, which
    reads α on the host) runs in two passes over its batches: ``begin(X)`` on each (device work;
    ``pending.request`` is a 1-D float64 tensor of what it must read), one
    ``torch.cat(...).tolist()`` of every request, then ``end(X, pending, values)`` on each.
    Its batches run one after another (their products use the intra-op threads), and the
    transient memory is the pending state of the batches that wait for the read (for the polar
    methods the Gram matrix and its square: ``2·min(m, n)²`` numbers per matrix) plus one
    batch. So that it stays bounded, the batches go in waves of at most ``max_pending``
    elements of pending state (at least one batch each; ``None``: the call's elements over
    :data:`PENDING_FRACTION`, at least :data:`PENDING_MIN`), one read a wave; a wave's batches
    are the same, and so is the result, whatever the waves. The other ops run as by
    :func:`batched_apply_`, after the reads.

    ``finite``: a 0-d bool tensor read with the first wave's requests; when it holds False no
    matrix is changed and False is returned. True otherwise. ``total``: the elements the default
    caps are shares of (default: the call's own; see :func:`batch_indices`).
    """
    for _, mats in jobs:
        for X in mats:
            if X.dim() != 2:
                raise ValueError(f"batched_apply_ takes 2-D matrices, got shape {tuple(X.shape)}")
    grad = torch.is_grad_enabled()  # grad mode is per thread: the workers get the caller's
    deferred, direct = [], []
    if total is None:  # the caps are shares of the call
        total = sum(X.numel() for _, mats in jobs for X in mats)
    for op, mats in jobs:
        mats = list(mats)
        products = _products(op, mats)
        cap = _cap(products, max_elements, total)
        later = getattr(op, "deferred", None)
        now: list[Tensor] = []  # a batch shares shape, dtype and device: one answer for all
        for batch in _batches(mats, cap):
            if later is not None and later(batch[0]):
                deferred.append((op, batch))
            else:
                now += batch
        direct.append((op, now, cap, products))
    if max_pending is None:
        max_pending = max(PENDING_MIN, total // PENDING_FRACTION)
    waves = _waves(deferred, max_pending)
    if not waves and finite is not None:
        waves = [[]]  # the finite check is read alone
    for wave in waves:
        if not _read_wave(wave, finite, grad):
            return False
        finite = None
    for op, mats, cap, products in direct:
        # with threads, the CPU's batches run side by side (a matmul-only op's products use
        # the threads themselves); the others one after another. Only they ask for the thread
        # count, which a matmul-only (e.g. a compiled, capturable) call never does.
        on_cpu = not products and any(X.device.type == "cpu" for X in mats)
        threads = _threads() if on_cpu else 1
        side: list[Tensor] = []
        rest: list[Tensor] = []
        for X in mats:
            (side if threads > 1 and X.device.type == "cpu" and not products else rest).append(X)
        for batch in _batches(rest, cap):
            _apply(op, batch, grad)
        _apply_on_cpu(op, side, cap, grad, threads)
    return True


def _threads() -> int:
    """The threads the CPU's batches run on: 1 while the PyTorch profiler is on."""
    return 1 if torch.autograd._profiler_enabled() else torch.get_num_threads()


def _pending_elements(batch: list[Tensor]) -> int:
    """The pending state of a deferred batch, as the polar methods hold it: ``2·min(m, n)²``
    numbers a matrix (the Gram matrix and its square)."""
    return 2 * min(batch[0].shape[-2:]) ** 2 * len(batch)


def consecutive_runs(sizes: Sequence[int], budget: int) -> list[list[int]]:
    """Consecutive runs of indices whose sizes add up to at most ``budget`` (at least one index
    each)."""
    runs: list[list[int]] = []
    total = 0
    for i, n in enumerate(sizes):
        if not runs or total + n > budget:
            runs.append([])
            total = 0
        runs[-1].append(i)
        total += n
    return runs


def _waves(deferred: list, max_pending: int) -> list[list]:
    """The deferred ``(op, batch)`` pairs in consecutive waves of at most ``max_pending``
    elements of pending state (at least one batch each)."""
    sizes = [_pending_elements(batch) for _, batch in deferred]
    return [[deferred[i] for i in run] for run in consecutive_runs(sizes, max_pending)]


def _read_wave(wave: list, finite: Tensor | None, grad: bool) -> bool:
    """``begin`` on each of a wave's batches, one host read of their requests (and of
    ``finite``), then ``end`` on each; False, with nothing changed, when ``finite`` is False."""
    with torch.set_grad_enabled(grad):
        pending = [op.begin(_stack(batch)) for op, batch in wave]
    requests = [p.request for p in pending]
    if finite is not None:
        requests.insert(0, finite.reshape(1).to(torch.float64))
    if len({r.device for r in requests}) > 1:  # one read per device
        requests = [r.cpu() for r in requests]
    values = torch.cat(requests).tolist() if requests else []
    if finite is not None and not values.pop(0):
        return False
    for i, (op, batch) in enumerate(wave):
        p, pending[i] = pending[i], None  # its state goes with its batch, not with the wave
        k = p.request.numel()
        with torch.set_grad_enabled(grad):
            out = op.end(_stack(batch), p, values[:k])
        values = values[k:]
        del p
        torch._foreach_copy_(batch, list(out.unbind(0)))
        del out  # before the next batch's: two outputs of the largest matrices were the peak
    return True


def _stack(batch: list[Tensor]) -> Tensor:
    return batch[0].unsqueeze(0) if len(batch) == 1 else torch.stack(batch)


def _apply_on_cpu(
    op: Callable[[Tensor], Tensor], mats: list[Tensor], max_elements: int, grad: bool, threads: int
) -> None:
    """The CPU part of :func:`batched_apply_` with ``threads > 1``: batches side by side."""
    if not mats:
        return
    cap = max(1, max_elements // threads)
    batches = []
    for batch in _batches(mats, cap):
        if batch[0].numel() > cap:  # one matrix above the cap: alone, with the intra-op threads
            _apply(op, batch, grad)
        else:
            batches.append(batch)
    if len(batches) < 2:  # one batch keeps the intra-op threads for its products
        for batch in batches:
            _apply(op, batch, grad)
        return
    calls = [functools.partial(_apply, op, batch, grad) for batch in batches]
    side_by_side(mats[0].device, calls, min(threads, len(batches)))


def _apply(op: Callable[[Tensor], Tensor], batch: list[Tensor], grad: bool) -> None:
    """``X ← op(X)`` for one batch, in grad mode ``grad``."""
    with torch.set_grad_enabled(grad):
        torch._foreach_copy_(batch, list(op(_stack(batch)).unbind(0)))
