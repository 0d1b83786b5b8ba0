"""Which form computes the global norm, and how its work is cut into bounded pieces (pure Python).

No MindSpore here: the step cell decides at construction, from the gradients' sizes and the
parallel mode, which strategy runs and what each kernel reads, and the graph code
(:mod:`gradmon.cells.norm_strategies`) only follows the plan.

Strategies (``norm_strategy``):

- ``"flat"``: every gradient concatenated into one float32 vector, squared, summed: three kernels
  however many tensors (fastest on small models), but an extra copy of all gradients (and a
  squared copy) in memory.
- ``"bucketed"``: the same over pieces of at most a bucket (an eighth of the bound; consecutive
  small tensors concatenated, large ones cut into slices), run one after the other so each piece's buffers are
  free before the next is built: bounded extra memory at any model size.
- ``"per_tensor"``: ``ReduceSum(Square(Cast(g)))`` per tensor through an ``ExpandDims`` carrying
  ``grad_scale=True``: the form MindSpore's semi/auto-parallel compiler completes with the
  cross-device reductions. The only form that is right under semi_auto/auto parallel.
- ``"fused"``: a single-pass kernel (``gradmon.cells.fused_norm``) where it is built.
- ``"auto"``: per_tensor under semi_auto/auto parallel; otherwise fused where it is built (CPU),
  else flat while its extra memory stays under the bound, then per_tensor, or bucketed when a
  single gradient is too large for the bound (see :func:`choose_strategy`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

NORM_STRATEGIES = ("auto", "flat", "bucketed", "per_tensor", "fused")

MIB = 2**20
# The extra peak memory the norm may cost over nn.TrainOneStepCell: max(64 MiB, 5 % of the gradients).
BOUND_FLOOR_BYTES = 64 * MIB
BOUND_FRACTION = 0.05
# Float32 bytes of one bucket, at least: two or three buffers of a bucket are alive at a time (the
# piece, its square, the unscaled copy under loss scaling) beside what the compiler keeps of the
# graph, so an eighth of the bound; larger models get larger buckets (an eighth of 5 % of their
# gradients), which keeps the piece count, and the kernels per step, under ~200 at any size.
BUCKET_BYTES = 8 * MIB
# Live float32 buffers of the flat form per gradient value: the concatenation, the unscaled copy
# (loss scaling) and the square; layer_stats adds the int32 segment ids.
_FLAT_BUFFERS = 3

# A piece of work: (first, stop, lo, hi) reads gradients[first:stop] whole and concatenated when
# lo < 0, else elements [lo, hi) of the flattened gradients[first] (stop == first + 1).
Piece = tuple[int, int, int, int]
# A group of pieces whose squared sums add into one entry: a bucket, or one tensor (layer_stats).
Group = tuple[Piece, ...]


def memory_bound(grad_bytes: int) -> int:
    """The allowed extra peak memory of the norm for gradients of ``grad_bytes`` bytes."""
    return max(BOUND_FLOOR_BYTES, int(BOUND_FRACTION * grad_bytes))


def flat_extra_bytes(numel: int, layer_stats: bool = False) -> int:
    """Estimated extra peak memory of the flat form over ``numel`` gradient values."""
    return (_FLAT_BUFFERS + (1 if layer_stats else 0)) * 4 * int(numel)


def choose_strategy(requested: str, compiler_completes: bool, numel: int, grad_bytes: int,
                    fused_available: bool | Callable[[], bool], layer_stats: bool = False,
                    largest_numel: int = 0) -> str:
    """The strategy that runs. ``requested`` must be one of :data:`NORM_STRATEGIES`.

    ``compiler_completes``: semi_auto/auto parallel, where only ``per_tensor`` is right (the caller
    refuses any other explicit request). ``numel``/``grad_bytes``: the gradients' value count and
    bytes in their own dtypes; ``largest_numel``: the largest gradient's value count.
    ``fused_available`` may be a callable, asked only when the choice comes to the fused kernel.

    ``auto``: ``fused`` where the kernel is built (CPU: one launch, one read of the gradients, no
    buffers: measured +6 MiB at 22M parameters and +17 MiB at 151M, within the bound, and faster than
    ``flat`` at every model size, docs/cells.md), else ``flat``
    while its extra memory fits the bound (small models: fewest stock kernels), then ``per_tensor``
    (measured the smallest extra memory of the stock forms: +10 MiB at 22M parameters, +23 MiB at
    151M, see benchmarks/RESULTS.md) unless one gradient's float32 square alone would pass the
    bound, then ``bucketed`` (slices bound even that).
    """
    if requested not in NORM_STRATEGIES:
        raise ValueError(f"norm_strategy must be one of {NORM_STRATEGIES}, got {requested!r}")
    if compiler_completes:
        return "per_tensor"
    if requested != "auto":
        return requested
    if fused_available() if callable(fused_available) else fused_available:
        return "fused"
    bound = memory_bound(grad_bytes)
    if flat_extra_bytes(numel, layer_stats) <= bound:
        return "flat"
    return "per_tensor" if 4 * int(largest_numel) <= bound else "bucketed"


def plan_groups(sizes: Sequence[int], bucket_elems: int, per_tensor: bool,
                classes: Sequence[int] | None = None) -> tuple[tuple[int, Group], ...]:
    """Cut tensors of ``sizes`` values into pieces of at most ``bucket_elems`` values.

    Returns ``(class, pieces)`` groups. ``classes`` (default all 0) tags each tensor (replicated,
    sharded, ...): a piece never mixes classes, and a group has its tensors' class.
    ``per_tensor=False``: consecutive tensors share a piece while they fit (one group per piece);
    a tensor larger than a bucket is cut into slices, one group each. ``per_tensor=True``: one
    group per tensor (its whole, or its slices), for per-tensor sums. Empty tensors get no piece
    (their square sum is 0; an empty group contributes 0).
    """
    if bucket_elems < 1:
        raise ValueError(f"bucket_elems must be >= 1, got {bucket_elems}")
    classes = [0] * len(sizes) if classes is None else [int(c) for c in classes]
    if len(classes) != len(sizes):
        raise ValueError("classes and sizes must have the same length")
    groups: list[tuple[int, Group]] = []
    run_start, run_elems = -1, 0  # the bucket being filled: tensors [run_start, i)

    def flush(stop: int) -> None:
        nonlocal run_start, run_elems
        if run_start >= 0:
            groups.append((classes[run_start], ((run_start, stop, -1, -1),)))
        run_start, run_elems = -1, 0

    for i, size in enumerate(int(s) for s in sizes):
        cls = classes[i]
        if per_tensor:
            pieces = _slices(i, size, bucket_elems) if size > bucket_elems else (
                ((i, i + 1, -1, -1),) if size > 0 else ())
            groups.append((cls, pieces))
            continue
        if size == 0 or size > bucket_elems or run_elems + size > bucket_elems or (
                run_start >= 0 and classes[run_start] != cls):
            flush(i)  # a piece holds consecutive tensors of one class that fit together
        if size == 0:
            continue
        if size > bucket_elems:
            groups.extend((cls, (piece,)) for piece in _slices(i, size, bucket_elems))
            continue
        if run_start < 0:
            run_start = i
        run_elems += size
    if not per_tensor:
        flush(len(sizes))
    return tuple(groups)


def _slices(index: int, size: int, bucket_elems: int) -> Group:
    return tuple((index, index + 1, lo, min(lo + bucket_elems, size)) for lo in range(0, size, bucket_elems))
