"""The peak of the tensor memory a step allocates, on any device: a model of
``torch.cuda.max_memory_allocated`` that runs on the CPU.

:class:`LiveBytes` is a ``TorchDispatchMode`` that counts the bytes of every storage an
operation creates (not the views and in-place results, which create none) from its creation
until Python frees it, and keeps the largest sum. The caching allocator's rounding and
fragmentation are left out, so on a GPU the measured peak is a little higher.

:func:`gpu_path_peak` runs a step on the CPU along the code path a CUDA step takes (the
deferred batches read in waves, :data:`spectra.optim.plan.READ_ONCE_ON_CPU`; Adam's foreach
route, ``spectra.optim.adamw.PER_TENSOR_DEVICES``) and returns the peak of its second step over
the parameters, gradients and state, against torch AdamW's the same way. At the 124M shapes
this model gave 1.17× (``mixed``) and 1.45× (``polar``) torch AdamW's peak where an H100 measured
1.18× and 1.46× (``bench optim``, docs/gpu.md) before the batch and wave fractions were cut.

:func:`gpu_path_host_ops` counts, along the same code path, the operations a step dispatches
(:class:`HostOps`): on a GPU each is a dispatch on the host and most a kernel launch, which set
the time of a step of many small matrices.
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveBytes(TorchDispatchMode):
    """Within the mode: ``live``, the bytes of the storages created under it and still alive,
    and ``peak``, the largest ``live`` seen."""

    def __init__(self) -> None:
        super().__init__()
        self._sizes: dict[int, int] = {}
        self.live = 0
        self.peak = 0

    def _free(self, key: int) -> None:
        self.live -= self._sizes.pop(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if any(r.alias_info is not None for r in func._schema.returns):
            return out  # a view, an in-place or an out= result: no new storage
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key, size = storage.data_ptr(), storage.nbytes()
            if size == 0 or key in self._sizes:
                continue
            self._sizes[key] = size
            self.live += size
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._free, key)
        return out


#: The products a GPU runs on bf16 operands in one kernel, with a bf16 result.
_PRODUCTS = ("mm", "bmm", "addmm", "baddbmm")


class _Bf16Products(TorchDispatchMode):
    """bf16 products at float32 speed: each runs on float32 copies of its operands and rounds its
    result to bf16 once (a tensor core's numerics, up to the order of the sums), or keeps it in
    float32 when asked (``out_dtype=torch.float32``, the CUDA overloads of split products, which
    the CPU lacks). A mode below :class:`LiveBytes` hides the float32 copies from it, which sees
    the result alone, as a GPU allocates it. A CPU without bf16 units would otherwise run
    torch's bf16 products some 50× slower than float32, or take the operators' emulation, whose
    float32 temporaries a GPU never allocates."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func.overloadpacket.__name__ in _PRODUCTS and any(
            isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 for a in args
        ):
            # the out_dtype overloads (aten::bmm.dtype, ...) take it among args or kwargs
            dtypes = [a for a in args if isinstance(a, torch.dtype)]
            keep = kwargs.pop("out_dtype", dtypes[0] if dtypes else None) == torch.float32
            wide = [a.float() if isinstance(a, torch.Tensor) else a for a in args
                    if not isinstance(a, torch.dtype)]  # fmt: skip
            out = func.overloadpacket.default(*wide, **kwargs)
            return out if keep else out.to(torch.bfloat16)
        return func(*args, **kwargs)


@contextmanager
def gpu_code_path() -> Iterator[None]:
    """Within: CPU steps take the code path of a CUDA step (deferred reads, foreach Adam, one
    multi-tensor finite check, ``mixed``'s split products for large matrices, and bf16
    products as on a device with bf16 units, float32 results of split products included, at
    float32 speed: :class:`_Bf16Products`)."""
    from spectra.ops import _common, mixed
    from spectra.optim import adamw, chain, plan

    settings = [
        (plan, "READ_ONCE_ON_CPU", True),
        (adamw, "PER_TENSOR_DEVICES", ()),
        (chain, "PER_TENSOR_CHECK_DEVICES", ()),
        (_common, "CPU_HAS_BF16_UNITS", True),
        (mixed, "SPLIT_DEVICES", ("cuda", "cpu")),
        (_common, "bf16_products_fp32", _common._float32_output_products),  # as on CUDA
    ]
    saved = [(module, name, getattr(module, name)) for module, name, _ in settings]
    for module, name, value in settings:
        setattr(module, name, value)
    try:
        with _Bf16Products():
            yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


def _after_first_step(
    make: Callable[[list[torch.Tensor]], Any], shapes: list[tuple[int, ...]], seed: int
) -> Any:
    """``make(params)`` on random parameters and gradients, after one step (its state made)."""
    gen = torch.Generator().manual_seed(seed)
    params = [torch.randn(s, generator=gen).requires_grad_() for s in shapes]
    for p in params:
        p.grad = 1e-3 * torch.randn(p.shape, generator=gen)
    opt = make(params)
    opt.step()  # the state exists from here on
    return opt


def step_peak(
    make: Callable[[list[torch.Tensor]], Any], shapes: list[tuple[int, ...]], seed: int = 0
) -> tuple[int, int]:
    """``(peak, resident)``: the bytes a second ``step()`` of ``make(params)`` allocates at its
    peak (:class:`LiveBytes`), and those of the parameters, gradients and state held before."""
    opt = _after_first_step(make, shapes, seed)
    params = [p for g in opt.param_groups for p in g["params"]]
    state = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]
    resident = sum(t.numel() * t.element_size() for t in [*params, *state])
    resident += sum(p.grad.numel() * p.grad.element_size() for p in params)
    with LiveBytes() as mode:
        opt.step()
    return mode.peak, resident


def gpu_path_peak(
    make: Callable[[list[torch.Tensor]], Any], shapes: list[tuple[int, ...]]
) -> float:
    """The peak of ``make``'s step on the CUDA code path over torch AdamW's (foreach), both
    counting the parameters, gradients and state."""
    with gpu_code_path():
        mine, held = step_peak(make, shapes)
        ref, ref_held = step_peak(lambda ps: torch.optim.AdamW(ps, lr=1e-3, foreach=True), shapes)
    return (held + mine) / (ref_held + ref)


class HostOps(TorchDispatchMode):
    """Within the mode: the aten operations dispatched, by kind (``kinds``) and by name
    (``names``). ``compute``: an operation that runs a kernel or allocates (a kernel launch
    on a GPU); ``view``: one that makes a view (metadata only); ``read``: a host read of a
    tensor's value (``_local_scalar_dense``: ``item()``, ``int()``; ``tolist()`` is not
    dispatched). Each is a dispatch on the host, which bounds a GPU step of small matrices."""

    def __init__(self) -> None:
        super().__init__()
        self.kinds: Counter[str] = Counter()
        self.names: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        kind = "view" if func.is_view else "read" if name == "_local_scalar_dense" else "compute"
        self.kinds[kind] += 1
        self.names[name] += 1
        return func(*args, **(kwargs or {}))


def gpu_path_host_ops(
    make: Callable[[list[torch.Tensor]], Any], shapes: list[tuple[int, ...]]
) -> HostOps:
    """The operations ``make``'s second step dispatches on the CUDA code path (the bf16
    products counted once each, as a GPU runs them: :class:`HostOps` above
    :class:`_Bf16Products`)."""
    with gpu_code_path():
        opt = _after_first_step(make, shapes, seed=0)
        with HostOps() as mode:
            opt.step()
    return mode


def model_shapes(large: bool) -> tuple[list[tuple[int, ...]], str]:
    """The parameter shapes the CPU models of the GPU step run at, and their name: the 124M
    shapes, or (``large``) eight layers of the 780M ones, where CUDA's ``mixed`` takes split
    bf16 products."""
    from spectra_lab.bench.optim import llama_shapes

    if large:
        return llama_shapes(8, 1280, 3584), "eight layers of the 780M shapes"
    return llama_shapes(), "124M shapes"


def write_model_report(out: str, what: str, shapes: list[tuple[int, ...]], rows: list) -> None:
    """Store the ``rows`` of a model of the GPU step run on the CPU (``what`` it measured, at
    the parameter ``shapes``) at ``out``, with this machine's description, atomically."""
    from spectra_lab.files import write_json_atomic
    from spectra_lab.machine import device_about

    report = {
        "what": what,
        "parameters": sum(torch.Size(s).numel() for s in shapes),
        "tensors": len(shapes),
        "machine": device_about("cpu"),
        "rows": rows,
    }
    write_json_atomic(out, report)
    print(f"wrote {out}")
