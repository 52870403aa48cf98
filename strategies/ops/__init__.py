"""Op rules: what ways DTensor can run each aten op sharded, with their costs.

Takes an op and its argument shapes (`TensorMeta`) on a `Mesh`; gives every strategy with compute, memory
and redistribution costs (`generate`). Families, one module each like ``torch/distributed/tensor/_ops/``,
register single-axis rules in `registry` when this package is imported; `fallback` reads PyTorch's own
rules for the rest; `dtensor_bridge` hands our rules to DTensor for ops it cannot run by itself.
"""

from strategies.ops import (  # noqa: F401  (importing a family registers its rules)
    attention_ops,
    einsum_ops,
    embedding_ops,
    grouped_mm_ops,
    math_ops,
    matrix_ops,
    pointwise_ops,
    tensor_ops,
    view_ops,
)
