"""Built-in models for planning (configurable, buildable on the meta device) and users' model factories."""

from strategies.models.builder import (
    MAX_DIM,
    MAX_ELEMENTS,
    MODELS,
    ModelOptionError,
    ModelSpec,
    build_model,
    load_factory,
    load_model,
    model_layers,
)

__all__ = [
    "MAX_DIM",
    "MAX_ELEMENTS",
    "MODELS",
    "ModelOptionError",
    "ModelSpec",
    "build_model",
    "load_factory",
    "load_model",
    "model_layers",
]
