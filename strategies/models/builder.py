"""Models to plan: the built-in ones by name, and users' own from ``path/file.py:factory``.

A :class:`ModelSpec` is what capture needs: the module, example inputs with global shapes, and the loss
function (``None``: :func:`strategies.graph.capture.default_loss`, the output's ``.loss`` or else its sum).
Built-in models are built on the ``meta`` device by default, so even llama3-70b costs no memory; their
parameters take ``dtype`` while buffers that must stay precise (RoPE tables) keep float32.

Built-in models and their options (keyword arguments of :func:`build_model`):

- ``mlp``: :class:`~strategies.models.mlp.MLP` on ``[batch, d]`` (``d=1024``, ``h=4096``) with a
  regression target ``[batch, d]`` as a second input; the model returns the summed squared error;
  ``seq`` is not used.
- ``gpt2-small``, ``llama3-8b``, ``llama3-70b``, ``llama3-405b``, ``moe``: language models on token ids
  ``[batch, seq]`` with next-token targets ``[batch, seq]`` as a second input; the model returns the
  cross-entropy loss. Options are fields of their config (``GPT2Config``, ``LlamaConfig``, ``MoEConfig``),
  e.g. ``dim=256``.

Options, ``batch``, ``seq`` and ``layers`` are checked before any tensor is built (see
:mod:`strategies.models.options`): a bad one raises :class:`ModelOptionError` (a ValueError) naming it,
and a combination that would make a tensor of more than :data:`MAX_ELEMENTS` elements a ValueError, so
hostile or careless values never reach torch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from strategies.graph.capture import JointGraph, LossFn, capture_step
from strategies.models.gpt2 import GPT2, GPT2Config
from strategies.models.llama import PRESETS, Llama
from strategies.models.mlp import MLP
from strategies.models.moe import MoEConfig, MoETransformer
from strategies.models.options import MAX_DIM, ModelOptionError, check_option, shown

MAX_ELEMENTS = 2**59
"""Most elements any one tensor of a built-in model may have (weight, activation or traced intermediate):
torch's storage sizes are int64 bytes, so 8-byte elements of twice as many still fit."""


@dataclass
class ModelSpec:
    """A module, example inputs for one training step, and its loss function."""

    module: nn.Module
    example_inputs: Any
    """Positional arguments (a tuple), keyword arguments (a dict) or one tensor."""
    loss_fn: LossFn | None = None
    """Output -> scalar loss; ``None`` means ``default_loss``."""

    def __iter__(self) -> Iterator[Any]:
        """Unpacks as ``module, example_inputs, loss_fn``."""
        return iter((self.module, self.example_inputs, self.loss_fn))

    def capture(self) -> JointGraph:
        """The joint forward + backward graph of one step (:func:`strategies.graph.capture.capture_step`)."""
        return capture_step(self.module, self.example_inputs, self.loss_fn)


Builder = Callable[..., ModelSpec]
"""``builder(batch=, seq=, device=, layers=, **options) -> ModelSpec``, run under ``torch.device(device)``
with the parameters' dtype as the default dtype."""


def build_model(
    name: str,
    *,
    batch: int,
    seq: int,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "meta",
    layers: int | None = None,
    **options: Any,
) -> ModelSpec:
    """A built-in model (:data:`MODELS`) with inputs of ``batch`` x ``seq`` tokens, built on ``device``
    with ``dtype`` parameters; ``layers`` overrides the depth, ``options`` the configuration.

    Raises :class:`ModelOptionError` for a bad option, ValueError naming ``batch``, ``seq``, ``layers``
    or ``dtype``, and ValueError (``"model: ..."``) when a tensor would exceed :data:`MAX_ELEMENTS`.
    """
    if name not in MODELS:
        raise ValueError(f"model: unknown model {name!r}; built-in models are {sorted(MODELS)}")
    for field_name, value in (("batch", batch), ("seq", seq), ("layers", 1 if layers is None else layers)):
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_DIM:
            raise ValueError(
                f"{field_name}: must be a positive integer at most {MAX_DIM}, got {shown(value)}"
            )
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        shown_dtype = dtype if isinstance(dtype, torch.dtype) else shown(dtype)
        raise ValueError(f"dtype: must be a floating torch dtype, got {shown_dtype}")
    with torch.device(device), _default_dtype(dtype):
        return MODELS[name](batch=batch, seq=seq, device=device, layers=layers, **options)


def factory_batch(spec: ModelSpec) -> int:
    """The batch of a model's example inputs: the first dim of their first tensor."""
    from strategies.graph.capture import input_tensors

    tensors = input_tensors(spec.example_inputs)
    if not tensors or tensors[0].dim() == 0:
        raise ValueError("batch: the model's example inputs have no batch dim to split")
    return int(tensors[0].shape[0])


def load_model(model: str, **build: Any) -> ModelSpec:
    """A built-in model by name (``build`` as for :func:`build_model`), or a user's ``path/file.py:factory``
    (``build`` is ignored: the factory fixes its own shapes)."""
    if model in MODELS:
        return build_model(model, **build)
    if ":" in model:
        return load_factory(model)
    raise ValueError(
        f"model: {model!r} is neither a built-in model {sorted(MODELS)} nor a path/file.py:factory"
    )


# ------------------------------------------------------------------------------------ built-in models


MLP_OPTIONS = {"d": 1024, "h": 4096}
"""The ``mlp`` model's options (both ints) and their defaults."""


def _mlp(*, batch: int, seq: int, device: Any, layers: int | None, **options: Any) -> ModelSpec:
    """``mlp``: two linear layers on ``[batch, d]`` (options ``d``, ``h``) and a regression target."""
    if layers is not None:
        raise ValueError("layers: mlp has exactly two layers; set its widths with d and h")
    _refuse_unknown("mlp", options, MLP_OPTIONS)
    d, h = (options.get(option, default) for option, default in MLP_OPTIONS.items())
    for option, value in (("d", d), ("h", h)):
        check_option(option, value, int)
    _check_sizes(
        "mlp",
        {
            "a weight (d x h)": d * h,
            "the hidden activations (batch x h)": batch * h,
            "the inputs (batch x d)": batch * d,
        },
    )
    inputs = (torch.randn(batch, d, device=device), torch.randn(batch, d, device=device))
    return ModelSpec(MLP(d, h), inputs)


def _language_model(
    name: str,
    make: Callable[[Any], nn.Module],
    config: Any,
    *,
    batch: int,
    seq: int,
    device: Any,
    layers: int | None,
) -> ModelSpec:
    """A model returning its cross-entropy loss, on random token ids and next-token targets."""
    if layers is not None:
        config = config.replace(n_layers=layers)
    if seq > config.max_seq_len:
        config = config.replace(max_seq_len=seq)
    _check_sizes(name, config.largest_tensors(batch * seq))
    tokens, targets = (torch.randint(config.vocab_size, (batch, seq), device=device) for _ in range(2))
    return ModelSpec(make(config), (tokens, targets))


def _with_options(config: Any, name: str, options: Mapping[str, Any]) -> Any:
    """``config`` with ``options`` applied; an option that is not a config field, or a value its field
    refuses (the config checks itself), raises :class:`ModelOptionError` naming it."""
    _refuse_unknown(name, options, {f.name for f in dataclasses.fields(config)})
    return config.replace(**options) if options else config


def _refuse_unknown(name: str, options: Mapping[str, Any], known: Iterable[str]) -> None:
    """Raise :class:`ModelOptionError` for the first (sorted) option of ``options`` not in ``known``."""
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ModelOptionError(unknown[0], f"not an option of {name}; options are {sorted(known)}")


def _check_sizes(name: str, elements: Mapping[str, float]) -> None:
    """Refuse a model whose largest tensor (``elements``: what it is -> element count) would exceed
    :data:`MAX_ELEMENTS`, before torch would fail on its int64 storage size."""
    tensor, count = max(elements.items(), key=lambda item: item[1])
    if count > MAX_ELEMENTS:
        raise ValueError(
            f"model: {name} with these options, batch and seq would hold {tensor} of more than "
            f"{MAX_ELEMENTS} elements, the most a tensor may have"
        )


def _language_model_builder(name: str, make: Callable[[Any], nn.Module], config: Any) -> Builder:
    def build(*, batch: int, seq: int, device: Any, layers: int | None, **options: Any) -> ModelSpec:
        configured = _with_options(config, name, options)
        return _language_model(name, make, configured, batch=batch, seq=seq, device=device, layers=layers)

    build.__doc__ = f"``{name}``: a {make.__name__} language model."
    build.config = config  # type: ignore[attr-defined]
    return build


def model_layers(model: str, **options: Any) -> int | None:
    """The depth a built-in language model has with ``options`` (None for other models)."""
    config = getattr(MODELS.get(model), "config", None)
    return None if config is None else int(_with_options(config, model, options).n_layers)


MODELS: dict[str, Builder] = {
    "mlp": _mlp,
    "gpt2-small": _language_model_builder("gpt2-small", GPT2, GPT2Config()),
    "llama3-8b": _language_model_builder("llama3-8b", Llama, PRESETS["llama3-8b"]),
    "llama3-70b": _language_model_builder("llama3-70b", Llama, PRESETS["llama3-70b"]),
    "llama3-405b": _language_model_builder("llama3-405b", Llama, PRESETS["llama3-405b"]),
    "moe": _language_model_builder("moe", MoETransformer, MoEConfig()),
}
"""Built-in model name -> builder."""


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Create floating tensors (parameters) in ``dtype`` unless a dtype is given explicitly."""
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)


# ------------------------------------------------------------------------------------- user factories


def load_factory(spec: str) -> ModelSpec:
    """A user's model from ``path/file.py:factory``: ``factory()`` returns ``(module, example_inputs)`` or
    ``(module, example_inputs, loss_fn)``. Anything wrong raises ValueError naming it."""
    path_text, sep, name = spec.rpartition(":")
    if not sep or not path_text or not name:
        raise ValueError(f"model: expected path/file.py:factory, got {spec!r}")
    factory = getattr(_import_file(Path(path_text)), name, None)
    if factory is None:
        raise ValueError(f"model: {path_text} has no function {name!r}")
    if not callable(factory):
        raise ValueError(f"model: {path_text}:{name} is a {type(factory).__name__}, not a function")
    try:
        result = factory()
    except Exception as error:
        raise ValueError(f"model: {spec}() raised {type(error).__name__}: {error}") from error
    return _spec_of(result, spec)


def _import_file(path: Path) -> Any:
    """The Python module at ``path``, imported with its folder on ``sys.path`` (for its own imports).

    The module is entered in ``sys.modules`` (dataclasses and pickling look it up there) and imported once
    per version of the file (its modification time): planning the same file again reuses it, so what it
    registers when imported (a custom op made with ``torch.library``) is registered once.
    """
    if not path.is_file():
        raise ValueError(f"model: file {str(path)!r} not found")
    resolved = path.resolve()
    version = (resolved, resolved.stat().st_mtime_ns)
    if version in _IMPORTED:
        return _IMPORTED[version]
    digest = hashlib.sha1(str(resolved).encode()).hexdigest()[:10]
    name = f"autoshard_factory_{digest}_{path.stem}"
    module_spec = importlib.util.spec_from_file_location(name, resolved)
    if module_spec is None or module_spec.loader is None:
        raise ValueError(f"model: {str(path)!r} is not a Python file")
    module = importlib.util.module_from_spec(module_spec)
    folder = str(resolved.parent)
    sys.path.insert(0, folder)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as error:
        sys.modules.pop(name, None)
        raise ValueError(f"model: importing {str(path)!r} raised {type(error).__name__}: {error}") from error
    finally:
        sys.path.remove(folder)
    _IMPORTED[version] = module
    return module


_IMPORTED: dict[tuple[Path, int], Any] = {}
"""(resolved path, modification time in ns) -> the module imported from that version of the file."""


def _spec_of(result: Any, spec: str) -> ModelSpec:
    """Check a factory's return value and make it a ModelSpec."""
    if not isinstance(result, tuple) or len(result) not in (2, 3):
        got = f"a tuple of {len(result)}" if isinstance(result, tuple) else f"a {type(result).__name__}"
        raise ValueError(
            f"model: {spec}() must return (module, example_inputs) or (module, example_inputs, loss_fn), "
            f"got {got}"
        )
    module, inputs, loss_fn = (*result, None) if len(result) == 2 else result
    if not isinstance(module, nn.Module):
        raise ValueError(f"model: {spec}() returned a {type(module).__name__} as module, not an nn.Module")
    if not isinstance(inputs, (tuple, list, Mapping, torch.Tensor)):
        raise ValueError(
            f"model: {spec}() returned a {type(inputs).__name__} as example_inputs; "
            "expected a tuple of arguments, a dict of keyword arguments or a tensor"
        )
    if loss_fn is not None and not callable(loss_fn):
        raise ValueError(f"model: {spec}() returned a {type(loss_fn).__name__} as loss_fn, not a function")
    return ModelSpec(module, tuple(inputs) if isinstance(inputs, list) else inputs, loss_fn)
