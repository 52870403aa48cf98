"""The plan's placement texts as the runtime reads them, each kind where it may appear.

- A tensor the step is given (parameter, input): every axis a placement a tensor can be put in, so no ``*``
  and no ``P(mask)``.
- An op's input: ``*`` on any axis means the op does not read that input, and the value goes to the op as
  it is. A rule writes ``*`` only for an input whose values the op never reads (``new_ones`` of another
  shape than its source, the members ``getitem`` does not pick); on a mesh of 2+ axes such a row can be
  combined with the all-replicate row on another axis (``["R", "*"]``: Gemma 2's and sliding-window
  Mistral's ``new_ones`` in transformers' ``and_masks``), and that ``R`` is nominal: the cost model prices
  a spec with ``*`` on any axis at 0 s (:func:`strategies.cost.comm.redistribute_s`), so moving the value
  on the other axes would run collectives the plan never predicted. ``P(mask)`` is no op's input: no rule
  reads it, and DTensor only makes it in an embedding lookup.
- An op's output: any placement, ``P(mask)`` included (a row-wise sharded embedding's output, DTensor's
  ``_MaskPartial``), kept as codes and compared with what DTensor made by :func:`differs`.

A text that is not one of these is the plan's fault (edited, or written by another version), not the
model's: the callers say so, naming the node.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from strategies.placement import NONE, P_MASK, Spec, from_dtensor, parse_spec, spec_text, to_dtensor

Placements = tuple[Any, ...]


def tensor_placements(texts: Sequence[str]) -> Placements:
    """DTensor placements of a parameter or input."""
    return to_dtensor(parse_spec(texts))


def read_placements(texts: Sequence[str] | None) -> Placements | None:
    """DTensor placements an op's input is moved to, ``None`` when the op does not read it (any
    placement will do)."""
    if texts is None:
        return None
    codes = parse_spec(texts, unread=True)
    if NONE in codes:
        return None
    if P_MASK in codes:
        raise ValueError(f"{spec_text(codes)}: P(mask) is made by an embedding lookup, no op reads it")
    return to_dtensor(codes)


def output_codes(texts: Sequence[str] | None) -> Spec | None:
    """The placement codes planned for an op's output, ``None`` for a non-tensor."""
    return None if texts is None else parse_spec(texts)


def hold_mask(value: Any) -> None:
    """Take one more hold on the mask of a ``P(mask)`` value before a reduction of it. DTensor reduces an
    embedding's ``_MaskPartial`` output once: the reduction releases the mask of the indices this rank does
    not hold, and a second one fails (``AssertionError`` in ``_reduce_shard_value``). A plan may read the
    value in two placements (llama3-8b's FSDP plan: the norm reads the lookup replicated, the residual add
    sharded), each reader reducing it: with a hold per reduction the mask (booleans of the indices' shape)
    stays with the value until it goes."""
    for placement in getattr(value, "placements", ()):
        mask = getattr(placement, "mask_buffer", None)
        if mask is not None and mask.data is not None:
            mask.materialize_mask(mask.data)


def release_mask(value: Any) -> None:
    """Give back the lookup's own hold on the mask of a ``P(mask)`` value that goes. Every reduction of it
    took a hold of its own (:func:`hold_mask`), so the one the embedding took would outlive the value: the
    propagator hands later lookups of the same shapes and placements the same ``_MaskPartial``, whose mask
    would still be held with other indices' data ("MaskBuffer has been materialized with conflicting
    data" on the next batch)."""
    for placement in getattr(value, "placements", ()):
        mask = getattr(placement, "mask_buffer", None)
        if mask is not None and mask.refcount > 0:
            mask.release_mask()


def differs(placements: Sequence[Any], codes: Spec) -> bool:
    """Whether DTensor placements are other than the planned ``codes`` (a ``_MaskPartial`` is ``P(mask)``)."""
    try:
        return from_dtensor(placements) != tuple(codes)
    except ValueError:  # a placement autoshard has no code for is not the plan's
        return True
