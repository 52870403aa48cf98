"""Request bodies in the OpenAPI document for routes that read their body themselves (so that a large one
is parsed off the event loop): :func:`json_body` names the schema, :func:`install_body_schemas` adds it and
the models it uses to the document's components."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

REF = "#/components/schemas/{model}"
_BODY_MODELS: list[type[BaseModel]] = []


def json_body(model: type[BaseModel] | dict[str, Any], name: str | None = None) -> dict[str, Any]:
    """``openapi_extra`` declaring a required JSON body: a model's schema, or ``model`` itself (a schema)."""
    if isinstance(model, dict):
        schema = model
    else:
        _BODY_MODELS.append(model)
        schema = {"$ref": REF.format(model=name or model.__name__)}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def install_body_schemas(app: FastAPI) -> None:
    """Make ``app.openapi()`` include the body models named by :func:`json_body`."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(
                title=app.title, version=app.version, summary=app.summary, routes=app.routes
            )
            components = document.setdefault("components", {}).setdefault("schemas", {})
            for model in _BODY_MODELS:
                schema = model.model_json_schema(ref_template=REF, mode="validation")
                components.update(schema.pop("$defs", {}))
                components[model.__name__] = schema
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
