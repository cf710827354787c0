r"""The spectral links of the SPECTRA chain across the ranks of ``torch.distributed``.

Here, **sharded** parameters: ``DTensor`` with Shard and Replicate placements on a 1-D or 2-D
mesh (FSDP2, tensor parallelism, FSDP × TP); replicated ones (DDP) are
:mod:`spectra.optim.replicated`'s. A shard is not a matrix, but every operator is a function of
the small Gram matrix (:mod:`spectra.ops.gram`). Each matrix takes the route that moves fewer
elements (:func:`route_of`):

  - the **Gram route**, where the long side is split: the short side is gathered where a mesh
    dimension splits it, each rank forms the ``s × s`` Gram matrix of its part, one
    all-reduce per set of mesh dimensions sums them (all such matrices in one buffer), one
    owner rank per matrix computes ``K`` and broadcasts it, and each rank applies it to its own
    part. No rank holds more of the matrix than its share of the long side.
  - the **whole-matrix route** otherwise (the short side alone is split, or the matrix is too
    square for its Gram matrix to be smaller): every rank contributes its shard to the full
    matrix (an all-gather), the owner applies the operator, and the result is scattered back
    as shards (``distribute_tensor(..., src_data_rank=owner)`` on a 1-D mesh; a broadcast and
    local slicing on a 2-D one). Uneven and empty shards follow DTensor's rules; one full
    matrix is held at a time.

  A tensor of several matrices (experts, fused blocks: :mod:`spectra.optim.layout`) whose
  shards cut its matrices takes the cheaper of the two (:func:`layout_route`), each expert and
  block its own matrix on either: on the Gram route, one batch of Gram matrices per block.

Owners are computed from shapes alone, so every rank agrees without communicating.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from spectra.ops._common import fp32_products_are_ieee
from spectra.ops.batched import batched_apply_
from spectra.optim.layout import MatrixLayout
from spectra.optim.plan import SpectralOp
from spectra.optim.replicated import assign_owners, balanced

Op = Callable[[Tensor], Tensor]


if dist.is_available():
    from torch.distributed.tensor import DTensor
else:  # a torch built without distributed support has no DTensor
    DTensor = None


def is_sharded(t: Tensor) -> bool:
    """Whether ``t`` is a ``DTensor`` (a parameter sharded by FSDP2 or any DTensor layout)."""
    # the class is looked up once, at import: a step asks several times a parameter
    return DTensor is not None and isinstance(t, DTensor)


def local(t: Tensor) -> Tensor:
    """The local shard of a ``DTensor`` (sharing its storage), or ``t`` itself."""
    return t.to_local() if is_sharded(t) else t


def shaped_like(p: Tensor, t: Tensor) -> Tensor:
    """``t`` (a local shard) as a ``DTensor`` with ``p``'s layout when ``p`` is one."""
    if not is_sharded(p):
        return t
    return DTensor.from_local(t, p.device_mesh, p.placements, shape=p.shape, stride=p.stride())


@contextlib.contextmanager
def whole_parameter(p: Tensor) -> Iterator[tuple[Tensor, Tensor]]:
    """``(weights, gradient)`` of ``p`` as whole plain tensors, for an update that needs them.

    For a ``DTensor`` parameter both are all-gathered; every rank then computes the same update
    on the whole tensor, and on exit keeps its own shard of the result (sliced locally, with no
    communication). For a plain parameter they are ``p`` and ``p.grad`` themselves.
    """
    if not is_sharded(p):
        yield p, p.grad
        return
    from torch.distributed.tensor import distribute_tensor

    check_layout(p)
    full = whole(p)
    yield full, whole(p.grad)
    local(p).copy_(
        distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None).to_local()
    )


def sparse_error(owner: str, p: Tensor) -> str:
    return (
        f"{owner} does not support sparse gradients: a parameter of shape {tuple(p.shape)} has "
        "one; use spectra.Spectra around an optimizer that does (e.g. torch.optim.SGD)"
    )


def check_layout(p: Tensor, where: str = "a DTensor parameter") -> None:
    """Refuse DTensor layouts the chain cannot clip: partial placements and meshes of more than
    two dimensions (``where`` names the parameter in the message)."""
    mesh, placements = p.device_mesh, p.placements
    ok = mesh.ndim <= 2 and all(_axis(pl) is not None or pl.is_replicate() for pl in placements)
    if not ok:
        raise ValueError(
            f"{where} of shape {tuple(p.shape)} with placements {placements} on a "
            f"{mesh.ndim}-D mesh is not supported: spectra's optimizers take Shard and Replicate "
            "placements on 1-D and 2-D meshes (FSDP2, tensor parallelism, FSDP x TP), not "
            "partial placements or meshes of more dimensions"
        )


def _axis(placement) -> int | None:
    """The axis of the ``(d0, d1·d2·…)`` matrix view a Shard-type placement splits (0: rows,
    1: columns), or ``None`` for Replicate and Partial."""
    if placement.is_replicate() or placement.is_partial():
        return None
    dim = getattr(placement, "dim", None)  # Shard, and FSDP2's _StridedShard over TP
    return None if dim is None else (0 if dim == 0 else 1)


def mesh_group(mesh) -> dist.ProcessGroup:
    """A process group of every rank of ``mesh``."""
    if mesh.ndim == 1:
        return mesh.get_group()
    if mesh.size() == dist.get_world_size():
        return dist.group.WORLD
    return mesh._flatten().get_group()


def split_group(params: Sequence[Tensor], enabled: bool) -> dist.ProcessGroup | None:
    """The process group that shares the spectral work of replicated parameters, or ``None``.

    ``None`` when ``enabled`` is false, no process group is initialised, it has one rank, or
    the parameters are ``DTensor`` (their own mesh then decides).
    """
    if not (enabled and dist.is_available() and dist.is_initialized()):
        return None
    if dist.get_world_size() == 1 or any(is_sharded(p) for p in params):
        return None
    return dist.group.WORLD


#: Whether sharded matrices may take the Gram route (``False``: every one is gathered whole, the
#: route of earlier versions; ``spectra bench dist`` measures both).
GRAM_ROUTE = True


@dataclass(frozen=True)
class Route:
    """How a sharded ``(m, n)`` matrix meets its operator.

    ``gram``: the Gram route. The mesh dimensions in ``gather_dims`` split the short side;
    they are gathered first (a part of the matrix, not all of it). The dimensions in
    ``reduce_dims`` split the long side: each rank forms the ``s × s`` Gram matrix of its
    columns (rows, if ``transposed``), and the sum over those dimensions is the whole matrix's.
    Otherwise the whole matrix is gathered (the short side alone is split, or the matrix is
    square enough that its Gram matrix moves as much).
    ``volume``: bytes moved per rank, the model the choice is made by (see :func:`route_of`).
    """

    gram: bool
    transposed: bool
    reduce_dims: tuple[int, ...]
    gather_dims: tuple[int, ...]
    volume: float


def route_of(p: Tensor, shape: tuple[int, int]) -> Route:
    r"""The cheaper route for the matrix ``shape`` of the DTensor ``p``: the one whose bytes
    received per rank (ring collectives, averaged over the ``P = R·S`` ranks that split the
    matrix, ``R`` and ``S`` the sizes of the mesh dimensions that split its long and its short
    side, ``e`` the bytes of ``p``'s dtype) are fewer.

    * Gram route: the gather of the short side, ``(m·n/R)(1 − 1/S)·e``; the reduce of the
      ``s × s`` Gram matrix to its owner over the long side's ranks and the broadcast of its
      factor back (with one flag), ``(1 − 1/R)·g·(2s² + 1)`` with ``g`` the bytes of
      :func:`gram_dtype` (a clip's; a float64 second pass is not modelled).
    * Whole-matrix route: the all-gather, ``(1 − 1/P)·m·n·e``, and the scatter back from the
      owner, one mesh dimension at a time (``(1 − 1/P)·m·n·e/P`` on a 1-D mesh); on an
      ``(a, b)`` mesh also the broadcast along the owner's row, ``(b − 1)/(a·b)·m·n·e``.
    """
    m, n = shape
    transposed = m > n  # the long side is the rows
    long_axis = 0 if transposed else 1
    reduce_dims, gather_dims = [], []
    for d, pl in enumerate(p.placements):
        axis = _axis(pl)
        if axis is not None:
            (reduce_dims if axis == long_axis else gather_dims).append(d)
    whole = _whole_volume(p, m * n)
    gram = _gram_volume(p, m * n, tuple(reduce_dims), tuple(gather_dims), [min(m, n)], 1)
    use = GRAM_ROUTE and len(reduce_dims) > 0 and gram < whole
    return Route(use, transposed, tuple(reduce_dims), tuple(gather_dims), gram if use else whole)


def layout_route(p: Tensor, layout: MatrixLayout) -> Route:
    r"""The cheaper route for the DTensor ``p`` of several matrices (``layout``: experts,
    blocks), by :func:`route_of`'s model. On the Gram route each matrix is its own: the mesh
    dimensions that split a batch dimension stay split (each rank keeps its experts and clips
    them with the ranks that hold the rest of them); of the matrices' two axes, the one whose
    Gram matrices ``Σᵢ sᵢ²`` (``sᵢ`` the other axis of matrix ``i``) move fewer bytes is
    reduced over (``transposed``: the rows), the other gathered. A block's part on a rank is
    where the rank's shard meets it, empty for some ranks, whole for others: its ``G`` is that
    part's, and the sum over the ranks is the block's. A ``_StridedShard`` (FSDP2 over tensor
    parallelism) takes the whole-matrix route."""
    k, size = layout.batch_dims, p.device_mesh.shape
    split: dict[str, list[int]] = {"batch": [], "rows": [], "columns": []}
    for d, pl in enumerate(p.placements):
        if _axis(pl) is not None:
            split["batch" if pl.dim < k else "rows" if pl.dim == k else "columns"].append(d)
    numel = math.prod(p.shape)
    whole = Route(False, False, (), (), _whole_volume(p, numel))
    if not GRAM_ROUTE or any(_is_strided(pl) for pl in p.placements):
        return whole
    shards = math.prod(size[d] for d in split["batch"])  # the matrices a rank holds: 1/shards
    best = whole
    for transposed, reduce, gather in ((False, "columns", "rows"), (True, "rows", "columns")):
        if not split[reduce]:
            continue
        sides = [n if transposed else m for m, n in layout.shapes(p.shape)]
        reduce_dims, gather_dims = tuple(split[reduce]), tuple(split[gather])
        volume = _gram_volume(p, numel, reduce_dims, gather_dims, sides, shards)
        if volume < best.volume:
            best = Route(True, transposed, reduce_dims, gather_dims, volume)
    return best


def _gram_volume(
    p: Tensor,
    numel: int,
    reduce_dims: tuple[int, ...],
    gather_dims: tuple[int, ...],
    sides: Sequence[int],
    shards: int,
) -> float:
    """The Gram route's bytes received per rank (see :func:`route_of`) for ``numel`` elements
    whose matrices have Gram matrices of these ``sides``, ``1/shards`` of them on each rank."""
    size = p.device_mesh.shape
    R = math.prod(size[d] for d in reduce_dims)
    S = math.prod(size[d] for d in gather_dims)
    e = p.dtype.itemsize
    g = 8 if e == 8 or not fp32_products_are_ieee(p.device) else 4
    grams = sum(2 * s * s + 1 for s in sides)
    return (numel / (R * shards)) * (1.0 - 1.0 / S) * e + (1 - 1 / R) * g * grams / shards


def _whole_volume(p: Tensor, numel: int) -> float:
    """The whole-matrix route's bytes received per rank (see :func:`route_of`): the all-gather,
    then ``distribute_tensor``'s scatter from the owner, one mesh dimension at a time (a
    Replicate dimension broadcasts its block); on a 2-D mesh the owner's row first receives the
    result."""
    size, e = p.device_mesh.shape, p.dtype.itemsize
    P = math.prod(size[d] for d, pl in enumerate(p.placements) if _axis(pl) is not None)
    whole, block = (1.0 - 1.0 / P) * numel * e, float(numel * e)
    for d, pl in enumerate(p.placements):
        split = _axis(pl) is not None
        whole += (size[d] - 1) / size[d] * (block / size[d] if split else block)
        block = block / size[d] if split else block
    if len(size) == 2:
        whole += (size[1] - 1) / (size[0] * size[1]) * numel * e
    return whole


def holds_whole_matrices(p: Tensor, layout: MatrixLayout | None) -> bool:
    """Whether each rank's shard of the ``DTensor`` ``p`` holds whole matrices of its
    ``layout``: the mesh splits batch dimensions only (FSDP2's ``Shard(0)`` of an expert
    stack ``(E, m, n)`` gives each rank whole experts), so each rank clips its own."""
    if layout is None or layout.batch_dims == 0:
        return False
    dims = [getattr(pl, "dim", None) for pl in p.placements if _axis(pl) is not None]
    return all(d is not None and d < layout.batch_dims for d in dims)


def apply_sharded(
    items: Sequence[tuple[Op, Tensor, Tensor, tuple[int, int]]],
    layouts: Sequence[MatrixLayout | None] | None = None,
) -> None:
    """``U ← op(U)`` for matrices held as shards: ``(op, local shard of U, DTensor parameter,
    (m, n))``, each by its route. A tensor with a layout of several matrices (``layouts[i]``;
    see :mod:`spectra.optim.layout`) takes :func:`layout_route`'s, the others
    :func:`route_of`'s."""
    layouts = [None] * len(items) if layouts is None else layouts
    gram, gram_layouts, whole, whole_layouts = [], [], [], []
    for item, layout in zip(items, layouts, strict=True):
        check_layout(item[2])
        several = layout is not None and layout.several
        route = layout_route(item[2], layout) if several else route_of(item[2], item[3])
        if route.gram:
            gram.append((*item, route))
            gram_layouts.append(layout if several else None)
        else:
            whole.append((*item, route))
            whole_layouts.append(layout)
    if gram:
        apply_gram(gram, gram_layouts)
    if whole:
        apply_whole(whole, whole_layouts)


def _redistribute(u: Tensor, p: Tensor, source, target) -> Tensor:
    """The local part, under the placements ``target``, of the tensor of ``p``'s mesh and
    shape whose local part under ``source`` is ``u``."""
    from torch.distributed.tensor import DTensor

    mesh = p.device_mesh
    d = DTensor.from_local(u, mesh, source, shape=p.shape, stride=p.stride())
    return d.redistribute(mesh, target).to_local()


def apply_gram(
    items: Sequence[tuple[Op, Tensor, Tensor, tuple[int, int], Route]],
    layouts: Sequence[MatrixLayout | None] | None = None,
) -> None:
    r"""The Gram route (see :mod:`spectra.ops.gram`). For each matrix: the short side gathered
    where a mesh dimension splits it; the local ``G_r = U_r U_rᵀ`` (:func:`gram_dtype`);
    within the group of ranks that split the long side, the ``G_r`` reduced to one owner rank
    (owners balanced by ``s³``; one reduce and one broadcast per owner, its matrices in one
    buffer), which computes ``K`` and broadcasts it to the group; then ``U_r ← K U_r`` on
    every rank. Ranks outside the group hold the same data (the mesh's other dimension
    replicates it, or was gathered) and do the same in their own group. No rank holds more of
    a matrix than its share of the long side.

    A tensor with a layout of several matrices (``layouts[i]``, routed by
    :func:`layout_route`) gives one batch of Gram matrices per block, over the batch entries
    its rank holds: ``G`` of each expert and block is its own."""
    from torch.distributed.tensor import Replicate

    mesh = items[0][2].device_mesh
    layouts = [None] * len(items) if layouts is None else layouts
    parts, pieces = [], []  # pieces: (item, a (B, s, l) view of its part: G = X Xᵀ)
    for j, ((_, u, p, _, route), layout) in enumerate(zip(items, layouts, strict=True)):
        placements = list(p.placements)
        if route.gather_dims:  # the short side whole, the long side still split
            placements = [Replicate() if d in route.gather_dims else pl
                          for d, pl in enumerate(placements)]  # fmt: skip
            part = _redistribute(u, p, p.placements, placements)
        else:
            part = u
        part = part.contiguous()
        parts.append((part, placements))
        for block in _blocks(part, p, placements, layout):
            if block.shape[0]:  # the same on every rank of the group: same batch entries
                pieces.append((j, block.mT if route.transposed else block))
    grams = [_local_gram(X, gram_dtype(X, items[j][0])) for j, X in pieces]
    by_group: dict[tuple[int, ...], list[int]] = {}
    for i, (j, _) in enumerate(pieces):
        by_group.setdefault(items[j][4].reduce_dims, []).append(i)
    factors: list[Tensor] = list(grams)
    for dims, idx in by_group.items():
        group = mesh.get_group(dims[0]) if len(dims) == 1 else mesh_group(mesh)
        ops = [items[pieces[i][0]][0] for i in idx]
        dtypes = [pieces[i][1].dtype for i in idx]
        got, redo = _factors_by_owner(ops, [grams[i] for i in idx], dtypes, group)
        for i, K in zip(idx, got, strict=True):
            factors[i] = K
        if redo:  # a second pass in float64 for the clips float32 cannot resolve
            again = [idx[k] for k in redo]
            grams64 = [_local_gram(pieces[i][1], torch.float64) for i in again]
            got, _ = _factors_by_owner(
                [ops[k] for k in redo], grams64, [dtypes[k] for k in redo], group
            )
            for i, K in zip(again, got, strict=True):
                factors[i] = K
    for (_, X), K in zip(pieces, factors, strict=True):
        cd = torch.float64 if X.dtype == torch.float64 else torch.float32
        X.copy_((K.to(cd) @ X.to(cd)).to(X.dtype))  # X is a view of its part
    for (_, u, p, _, route), (part, placements) in zip(items, parts, strict=True):
        if route.gather_dims:
            u.copy_(_redistribute(part, p, placements, p.placements))
        elif part is not u:
            u.copy_(part)


def _blocks(part: Tensor, p: Tensor, placements, layout: MatrixLayout | None) -> list[Tensor]:
    """``(B, rows, columns)`` views of ``part``, the local part of ``p``'s tensor under
    ``placements`` (contiguous): the tensor as one matrix ``(d0, d1·d2·…)`` (``B = 1``), or
    one view per block of ``layout`` over the batch entries ``part`` holds, each the part of
    the block that lies in ``part`` (possibly empty)."""
    if layout is None:
        return [part.view(1, part.shape[0], math.prod(part.shape[1:]))]
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    k = layout.batch_dims
    x = part.view(math.prod(part.shape[:k]), *part.shape[k:])
    if layout.split_sizes is None:
        return [x.view(x.shape[0], x.shape[1], math.prod(x.shape[2:]))]
    _, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, placements)
    first, length = offset[layout.split_dim], part.shape[layout.split_dim]
    axis = layout.split_dim - k + 1
    views, start = [], 0
    for size in layout.split_sizes:
        lo, hi = max(start, first), min(start + size, first + length)
        views.append(x.narrow(axis, lo - first, hi - lo) if hi > lo else x.narrow(axis, 0, 0))
        start += size
    return views


def gram_dtype(X: Tensor, op: SpectralOp) -> torch.dtype:
    """The precision of the Gram route's ``G`` and ``K`` (and of their messages), as the
    single-process routes choose it: float32 for float32, bf16 and fp16 matrices where float32
    products are IEEE, with a second pass in float64 for a clip the float32 G cannot resolve
    (:func:`spectra.ops.gram.gram_factor` returns ``None``, :func:`_factors_by_owner` flags
    it); float64 for float64 matrices, where float32 products run in TF32 or bf16, and for the
    SVD orthogonalization (whose small directions float32 would not resolve). The exact
    weights are computed in float64 either way."""
    exact_orth = op.kind == "orthogonalize" and op.method in ("auto", "svd")
    if X.dtype == torch.float64 or exact_orth or not fp32_products_are_ieee(X.device):
        return torch.float64
    return torch.float32


def _local_gram(X: Tensor, dtype: torch.dtype) -> Tensor:
    """``X Xᵀ`` in ``dtype`` (zeros for an empty shard)."""
    Xd = X.to(dtype)
    return Xd @ Xd.mT


def _factors_by_owner(
    ops: Sequence[Op], grams: list[Tensor], dtypes: Sequence[torch.dtype], group
) -> tuple[list[Tensor], list[int]]:
    """``op.gram_factor(ΣG, dtype)`` for each Gram matrix of ``dtype`` matrices, where each rank
    of ``group`` holds a part ``G`` of the sum: the parts are reduced to the matrix's owner
    rank, which computes the factor and broadcasts it (in ``G``'s dtype), one reduce and one
    broadcast per owner; and the positions of the matrices whose float32 ``G`` the owner found
    too coarse (the factor is ``None``; a flag is sent with the factors), which need a float64
    pass."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    owners = balanced([math.prod(G.shape[:-2]) * G.shape[-1] ** 3 for G in grams], world)
    factors = list(grams)
    redo: list[int] = []
    for r in range(world):
        mine = [i for i, o in enumerate(owners) if o == r]
        if not mine:
            continue
        src = dist.get_global_rank(group, r)
        flat = torch.cat([grams[i].reshape(-1) for i in mine])
        sizes = [grams[i].numel() for i in mine]
        if world > 1:
            dist.reduce(flat, dst=src, group=group)
        if rank == r:
            out = []
            for i, part in zip(mine, flat.split(sizes), strict=True):
                G = part.view(grams[i].shape)
                K = ops[i].gram_factor(G, dtypes[i])
                flag = K is None
                K = torch.zeros_like(G) if flag else K.to(G.dtype)
                out += [K.reshape(-1), G.new_full((1,), float(flag))]
            flat = torch.cat(out)
        else:
            flat = flat.new_empty(sum(sizes) + len(mine))
        if world > 1:
            dist.broadcast(flat, src=src, group=group)
        parts = flat.split([n + 1 for n in sizes])
        for i, part in zip(mine, parts, strict=True):
            factors[i] = part[:-1].view(grams[i].shape)
        flags = torch.stack([part[-1] for part in parts]).tolist()  # one read per owner
        redo += [i for i, f in zip(mine, flags, strict=True) if f]
    return factors, sorted(redo)


def assemble(u: Tensor, p: Tensor) -> Tensor:
    """The whole tensor of which ``u`` is ``p``'s local part (an all-gather over its mesh)."""
    return whole(shaped_like(p, u))


def whole(t: Tensor) -> Tensor:
    """``t.full_tensor()`` for a ``DTensor`` (every rank gets the whole tensor), ``t`` itself
    for any other tensor.

    Where both dimensions of a 2-D mesh split the tensor, it is gathered one mesh dimension at
    a time (:func:`gather_order`): the same all-gathers DTensor would run in one
    ``redistribute``, without the warning it logs for them (see docs/distributed.md).
    """
    if not is_sharded(t):
        return t
    order = gather_order(t.placements)
    if len(order) < 2:
        return t.full_tensor()
    from torch.distributed.tensor import Replicate

    placements = list(t.placements)
    for d in order:
        placements[d] = Replicate()
        t = t.redistribute(t.device_mesh, placements)
    return t.to_local()


def gather_order(placements: Sequence) -> list[int]:
    """The mesh dimensions that split a tensor, in the order to gather them one at a time: the
    innermost split first. Shards on one tensor dimension nest left to right (the last mesh
    dimension splits the first one's shard), except ``_StridedShard``: FSDP2 over tensor
    parallelism splits the TP shard further and marks its own, outer, mesh dimension so."""
    dims = [d for d, pl in enumerate(placements) if _axis(pl) is not None]
    strided = [d for d in dims if _is_strided(placements[d])]
    return strided + [d for d in reversed(dims) if d not in strided]


def _is_strided(placement) -> bool:
    from torch.distributed.tensor.placement_types import _StridedShard

    return isinstance(placement, _StridedShard)


def apply_whole(
    items: Sequence[tuple[Op, Tensor, Tensor, tuple[int, int], Route]],
    layouts: Sequence[MatrixLayout | None] | None = None,
) -> None:
    """The whole-matrix route, one matrix at a time: the matrix assembled (:func:`assemble`),
    ``op`` applied by its owner rank (balanced by ``m·n·min(m, n)``), and the result scattered
    back as shards (``distribute_tensor(..., src_data_rank=owner)``). On a 2-D mesh the owners
    are the ranks at the coordinates ``(k, k)``, ``distribute_tensor`` scatters from the ranks
    of the owner's row, and the owner first broadcasts its result along that row. A layout that
    ``distribute_tensor`` cannot scatter (:func:`scatters`) gets the result broadcast along the
    columns too, and each rank keeps its part. A tensor with a layout (``layouts[i]``) is
    assembled whole and its owner applies ``op`` to each of its matrices."""
    from torch.distributed.tensor import distribute_tensor

    mesh = items[0][2].device_mesh
    owners = assign_owners([item[3] for item in items], min(mesh.shape))
    coord = mesh.get_coordinate()
    layouts = [None] * len(items) if layouts is None else layouts
    for (op, u, p, shape, _), layout, k in zip(items, layouts, owners, strict=True):
        full = assemble(u, p)
        if all(c == k for c in coord) and layout is not None:
            full = full.contiguous()
            batched_apply_(op, layout.matrices(full))
        elif all(c == k for c in coord):
            full = op(full.reshape(1, *shape)).reshape(p.shape)
        full = full.contiguous()
        if mesh.ndim == 2 and coord[0] == k:
            row = mesh.get_group(1)
            dist.broadcast(full, src=dist.get_global_rank(row, k), group=row)
        if scatters(p):
            # src_data_rank is a rank within each mesh dimension: (k) on 1-D, (k, k) on 2-D
            out = distribute_tensor(full, mesh, p.placements, src_data_rank=k)
        else:  # every rank takes the result whole and keeps its part (no communication)
            column = mesh.get_group(0)
            dist.broadcast(full, src=dist.get_global_rank(column, k), group=column)
            out = distribute_tensor(full, mesh, p.placements, src_data_rank=None)
        u.copy_(out.to_local())


def scatters(p: Tensor) -> bool:
    """Whether ``distribute_tensor`` can scatter a tensor of ``p``'s shape and placements from
    one rank: not where a ``_StridedShard`` (FSDP2 over tensor parallelism) splits a dimension
    unevenly, whose padded chunks differ in size, which it refuses (an ``AssertionError``)."""
    for d, pl in enumerate(p.placements):
        if _is_strided(pl) and p.shape[pl.dim] % (pl.split_factor * p.device_mesh.size(d)):
            return False
    return True


def frobenius_norms(tensors: Sequence[Tensor], params: Sequence[Tensor]) -> list[Tensor]:
    """‖t‖_F of each tensor, where ``tensors[i]`` is the local shard of ``params[i]`` when that
    is a ``DTensor``: the shards' squared norms are summed over its mesh."""
    norms = list(torch._foreach_norm(list(tensors)))
    # the shards' squares are summed over the mesh dimensions that split each tensor
    by_dims: dict[tuple, list[int]] = {}
    for i, p in enumerate(params):
        if is_sharded(p):
            dims = tuple(d for d, pl in enumerate(p.placements) if _axis(pl) is not None)
            if dims:
                by_dims.setdefault((id(p.device_mesh), dims), []).append(i)
    for (_, dims), idx in by_dims.items():
        sq = torch.stack([norms[i].square() for i in idx])
        for d in dims:
            dist.all_reduce(sq, group=params[idx[0]].device_mesh.get_group(d))
        for j, i in enumerate(idx):
            norms[i] = sq[j].sqrt()
    return norms


def shard_group(tensors: Sequence[Tensor]) -> dist.ProcessGroup | None:
    """The process group of every rank of the first ``DTensor``'s mesh, or ``None`` if there
    is none."""
    for t in tensors:
        if t is not None and is_sharded(t):
            return mesh_group(t.device_mesh)
    return None
