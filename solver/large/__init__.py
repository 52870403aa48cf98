"""Programs too large to hand whole to a backend: solved through smaller restricted programs.

Takes a `CompactProblem`, an incumbent and a backend; gives a better assignment. `pruned` keeps each node's
few most promising strategies (TRW-S beliefs) and solves that program whole; `regions` re-optimises one
region at a time, regions grown along the graph (`lns`) or around the memory peak (`peak`)."""
