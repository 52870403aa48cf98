"""Heuristics: feasible answers in seconds, improved while time lasts, with no proof of optimality.

Takes a `CompactProblem` (and a time budget, a seed); gives an assignment and its cost. `anytime` is the
search (numba `kernels` over the flat `state`, after `contract`ing forced nodes); `portfolio` runs it on
every core."""
