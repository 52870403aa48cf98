"""Bounds: proven lower bounds that make an answer a certificate.

Takes a `CompactProblem`; gives a lower bound on its optimum (and, from the search, promising strategies):
TRW-S on the pairwise relaxation (`trws`), with the memory limit priced in (`memory_priced`),
Lagrangian branch-and-bound over both (`lagrangian_branch`), and the smallest peak any assignment can
reach (`min_peak`)."""
