"""Op families, one module each (like ``torch/distributed/tensor/_ops/``); importing registers them."""

from strategies.ops import matrix_ops  # noqa: F401
