"""Op families, one module each (like ``torch/distributed/tensor/_ops/``); importing registers them."""

from strategies.ops import (  # noqa: F401
    attention_ops,
    einsum_ops,
    embedding_ops,
    math_ops,
    matrix_ops,
    pointwise_ops,
    tensor_ops,
    view_ops,
)
