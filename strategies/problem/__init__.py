"""Problem building: from a captured training step to the solver's `Problem`.

Takes a joint graph, a mesh and a memory budget; gives a `BuiltProblem` (`builder`): one node per op with its
strategies, parameters with optimizer state, memory by liveness; repeated layers share decisions
(`layer_sharing`) and deep stacks are planned from a short capture (`layer_repeat`)."""
