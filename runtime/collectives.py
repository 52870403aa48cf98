"""The bytes of the collectives a step really runs (DTensor's functional collectives; CommDebugMode counts
them but does not weigh them).

Bytes are per device and counted as the plan counts them (:func:`strategies.cost.comm.redistribute_steps`):
an all-gather by the gathered tensor (input x group size), an all-reduce, reduce-scatter or all-to-all by the
tensor each device puts in.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

#: DTensor's functional collectives -> the names plans use.
COLLECTIVE_NAMES = {
    "all_reduce": "all_reduce",
    "all_gather_into_tensor": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "all_to_all_single": "all_to_all",
    "broadcast": "broadcast",
}


class CountCollectives(TorchDispatchMode):
    """Within it, ``counts`` and ``nbytes`` per collective (plan names) of every functional collective run."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()
        self.nbytes: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = COLLECTIVE_NAMES.get(func._overloadpacket.__name__)
        if name is not None:
            tensor = args[0]
            size = tensor.numel() * tensor.element_size()
            if name == "all_gather":
                size *= int(args[1])  # all_gather_into_tensor(input, group_size, group)
            self.counts[name] += 1
            self.nbytes[name] += size
        return func(*args, **(kwargs or {}))
