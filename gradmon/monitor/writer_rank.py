"""Which rank writes a job's run log (``LiveMonitor(writer_rank=...)``). Pure, no MindSpore.

One log per job. Under data parallelism every rank holds the same loss and norm, and rank 0
writes, as before. Under pipeline parallelism only the last stage computes the loss: MindSpore's
stages and mindformers 2.x's ``ParallelDims`` both put the pipeline dimension outermost (stage
``rank // (world_size // stages)``), so the last rank, ``world_size - 1``, is on the last stage
(mindformers' own TensorBoard writer picks it too). That is the default there.
"""

from __future__ import annotations

import numbers
from typing import Union

__all__ = ["WRITER_RANK_CHOICES", "WriterRank", "check_writer_rank", "writer_rank"]

# The named choices of ``writer_rank``; an int names a rank (negative: counted from the end).
WRITER_RANK_CHOICES = ("auto", "first", "last_stage")

WriterRank = Union[int, str, None]


def check_writer_rank(choice: WriterRank) -> WriterRank:
    """``choice`` if it is a valid ``writer_rank`` setting (None, an int, or one of
    :data:`WRITER_RANK_CHOICES`), else ``ValueError``/``TypeError`` saying what is accepted."""
    if choice is None or choice in WRITER_RANK_CHOICES:
        return choice
    if isinstance(choice, bool) or not isinstance(choice, numbers.Integral):
        raise TypeError(f"writer_rank must be None, an int or one of {WRITER_RANK_CHOICES}, got {choice!r}")
    return int(choice)


def writer_rank(world_size: int, pipeline_stages: int = 1, choice: WriterRank = None) -> int:
    """The rank that writes the job's log.

    ``choice``: None or ``"auto"`` — the last rank (the last pipeline stage, which holds the loss)
    when ``pipeline_stages > 1``, else rank 0; ``"first"`` — rank 0; ``"last_stage"`` — the last
    rank; an int — that rank (``-1``: the last). Raises ``ValueError`` for a rank outside the job.
    """
    world_size = max(int(world_size), 1)
    choice = check_writer_rank(choice)
    if choice is None or choice == "auto":
        return world_size - 1 if int(pipeline_stages or 1) > 1 else 0
    if choice == "first":
        return 0
    if choice == "last_stage":
        return world_size - 1
    rank = int(choice) + world_size if int(choice) < 0 else int(choice)
    if not 0 <= rank < world_size:
        raise ValueError(f"writer_rank={choice} is outside the job's ranks 0..{world_size - 1}")
    return rank
