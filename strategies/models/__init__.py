"""Built-in models for planning (configurable, buildable on the meta device) and users' model factories."""

from strategies.models.builder import (
    MODELS,
    ModelSpec,
    build_model,
    load_factory,
    load_model,
    model_layers,
)

__all__ = ["MODELS", "ModelSpec", "build_model", "load_factory", "load_model", "model_layers"]
