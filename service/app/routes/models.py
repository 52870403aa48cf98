"""``/v1/models``: the built-in models a plan request may name, with their configuration options."""

from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import APIRouter

from service.app.deps import CanRead
from service.app.schemas import ModelInfo

router = APIRouter(prefix="/v1/models", tags=["models"])

MLP_OPTIONS = {"d": 1024, "h": 4096}


@router.get("", dependencies=[CanRead])
def list_models() -> list[ModelInfo]:
    """Built-in models: name, options (configuration fields and their defaults) and depth."""
    from strategies.models import MODELS, model_layers

    models = []
    for name, builder in sorted(MODELS.items()):
        config = getattr(builder, "config", None)
        options: dict[str, Any] = dict(MLP_OPTIONS) if config is None else dataclasses.asdict(config)
        models.append(ModelInfo(name=name, options=options, layers=model_layers(name)))
    return models
