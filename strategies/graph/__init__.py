"""Graph capture: one training step of a module as a joint forward + backward aten graph on fake tensors.

Takes an `nn.Module`, example inputs and a loss; gives a `JointGraph` (`capture`) rewritten so the planner
sees more ways to shard it (`passes`: sequence dims exposed to matmuls, exact mean losses)."""
