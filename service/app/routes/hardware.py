"""``/v1/hardware``: the hardware presets, with every figure (a request may override any of them)."""

from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import APIRouter

from service.app.deps import CanRead

router = APIRouter(prefix="/v1/hardware", tags=["hardware"])


@router.get("", dependencies=[CanRead])
def list_hardware() -> dict[str, dict[str, Any]]:
    """Preset name -> figures: peak FLOP/s per dtype, memory bandwidth (bytes/s) and capacity (bytes),
    links (bytes/s, seconds)."""
    from strategies.cost.hardware import PRESETS

    return {name: dataclasses.asdict(hardware) for name, hardware in PRESETS.items()}
