"""Sharded checkpoints with ``torch.distributed.checkpoint``: save under one plan, load under another.

Each rank writes only its own pieces of the DTensor parameters and optimizer state (DCP's planner dedups
what is replicated); loading reads, on each rank, exactly the pieces its new placements need, whatever mesh
or placements the checkpoint was written under. The model's state is read through
``torch.distributed.checkpoint.state_dict`` on the module whose parameters `apply_plan` made DTensors.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn


def save(module: nn.Module, optimizer: torch.optim.Optimizer, directory: str | Path) -> None:
    """Write the module's parameters and buffers and the optimizer's state to ``directory``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(module, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(directory))


def load(module: nn.Module, optimizer: torch.optim.Optimizer, directory: str | Path) -> None:
    """Fill the module's parameters (in their current placements) and the optimizer's state from
    ``directory``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    if not (Path(directory) / ".metadata").is_file():
        raise FileNotFoundError(f"--load: {directory} holds no checkpoint")
    model_state, optimizer_state = get_state_dict(module, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=str(directory))
    set_state_dict(module, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
