"""Feature detection for the MindSpore versions gradmon's cells support (2.7 on; 2.7 to 2.10 tested).

Nothing here compares version strings: each capability the cells use is looked up by name, and a
missing one raises :class:`UnsupportedMindSporeError` naming the supported range and the gap. A newer
MindSpore (2.11) is accepted when it has them all.
"""

from __future__ import annotations

SUPPORTED_RANGE = "MindSpore 2.7 or later (tested: 2.7 to 2.10)"

# mindspore.ops functions the graph code calls; all exist in 2.7 through 2.10.
_REQUIRED_OPS = (
    "assign", "broadcast_to", "cast", "concat", "depend", "fill", "isfinite", "logical_and", "logical_not",
    "maximum", "minimum", "ones_like", "reduce_sum", "scatter_update", "select", "sqrt", "square",
    "stack", "unsorted_segment_sum",
)


class UnsupportedMindSporeError(RuntimeError):
    """The installed MindSpore lacks something gradmon's cells need."""


def mindspore_version() -> str:
    import mindspore

    return str(getattr(mindspore, "__version__", "unknown"))


def require_supported() -> None:
    """Raise :class:`UnsupportedMindSporeError` unless every capability the cells use is present."""
    try:
        import mindspore  # noqa: F401
        from mindspore import nn, ops
    except ImportError as exc:  # pragma: no cover - exercised only without MindSpore
        raise UnsupportedMindSporeError(
            f"gradmon.cells needs MindSpore ({SUPPORTED_RANGE}); import failed: {exc}"
        ) from exc
    missing = [f"mindspore.ops.{name}" for name in _REQUIRED_OPS if not hasattr(ops, name)]
    for name in ("TrainOneStepCell", "DynamicLossScaleUpdateCell", "FixedLossScaleUpdateCell"):
        if not hasattr(nn, name):
            missing.append(f"mindspore.nn.{name}")
    if not hasattr(ops, "GradOperation"):
        missing.append("mindspore.ops.GradOperation")
    if missing:
        raise UnsupportedMindSporeError(
            f"gradmon.cells supports {SUPPORTED_RANGE}; MindSpore {mindspore_version()} lacks "
            + ", ".join(missing)
        )


def check_train_cell_layout(cell: object) -> None:
    """Check that ``nn.TrainOneStepCell.__init__`` set the attributes the monitored step builds on."""
    needed = ("network", "optimizer", "weights", "grad", "grad_no_sens", "grad_reducer", "sense_flag", "sens")
    missing = [name for name in needed if not hasattr(cell, name)]
    if missing:
        raise UnsupportedMindSporeError(
            f"gradmon.cells supports {SUPPORTED_RANGE}; nn.TrainOneStepCell of MindSpore "
            f"{mindspore_version()} does not set {', '.join(missing)}"
        )
