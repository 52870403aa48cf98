"""A module's parameters made DTensors in their planned placements, each rank making only its own shards.

Three sources, one walk over the module's submodules (children before their parent, as ``nn.Module.apply``
visits them), each parameter placed the first time it is met (a tied one once, under every name):

- **full tensors every rank holds** (a module built on a real device): each rank keeps its part;
- **the module's own initialisation** for parameters on the meta device: one submodule at a time, its own
  parameters (and meta buffers) are made on the CPU, initialised by ``init(submodule)`` (default: the
  submodule's ``reset_parameters()``), cut to this rank's part and freed. The random numbers are drawn in the
  order one process draws them running ``module.apply(init)`` after the same seed, so the whole equals that
  one-process model (for the built-in models, the model their constructor makes) on any device, whatever the
  placements. The largest thing a rank holds whole is one submodule's own parameters (an embedding table),
  never the model; every rank draws every number, so this costs the whole model's initialisation time;
- **weights on disk**: a ``torch.distributed.checkpoint`` directory (DCP reads each rank's pieces only) or a
  safetensors file, or a directory of them with a Hugging Face ``model.safetensors.index.json``: each rank
  reads only the rows that hold its slices, a block at a time, and keeps its slice
  (:mod:`runtime.safetensors_slices`).

Each rank's part is the one DTensor holds for the placements (:func:`runtime.local_inputs.part_of`:
DTensor's own cut).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate

from runtime.local_inputs import part_of
from runtime.plan_checks import Placements, PlanMismatch
from runtime.safetensors_slices import Entry, entries
from runtime.safetensors_slices import read as read_slice
from strategies.graph.capture import JointGraph

Initialiser = Callable[[nn.Module], None]
"""Initialises one module's own parameters (``recurse=False``) in place, e.g. a Hugging Face model's
``_init_weights``; the default calls the module's ``reset_parameters()``."""


@contextmanager
def meta_parameters() -> Iterator[None]:
    """Inside, every parameter a module registers is moved to the meta device (the constructor's
    initialisation then costs nothing), while buffers are made where the module makes them (RoPE tables,
    masks: computed, small, and not what an initialiser makes again)."""
    register = nn.Module.register_parameter

    def on_meta(self: nn.Module, name: str, parameter: nn.Parameter | None) -> None:
        if parameter is not None and not parameter.is_meta:
            parameter = nn.Parameter(parameter.to("meta"), requires_grad=parameter.requires_grad)
        register(self, name, parameter)

    nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


def place_parameters(
    module: nn.Module,
    graph: JointGraph,
    placements: Mapping[str, Placements],
    mesh: DeviceMesh,
    init: Initialiser | None = None,
    weights: str | Path | None = None,
    only: bool = False,
) -> dict[str, nn.Parameter]:
    """Every parameter of ``module`` (captured as ``graph``) as a DTensor parameter in ``placements`` (by
    its first name), set on the module under each of its names; returned by first name. Parameters on the
    meta device are initialised (``init``) or read from ``weights``; the others are full tensors every rank
    holds alike. With ``only``, the parameters ``placements`` does not name (another pipeline stage's) are
    left on the meta device instead (still drawn where a sharded build draws them, so the random state
    moves as the whole build's)."""
    first = _first_names(graph)
    source = None if weights is None else open_weights(weights)
    placed: dict[str, nn.Parameter] = {}
    for prefix, submodule in _children_first(module):
        own = {
            leaf: parameter
            for leaf, parameter in submodule._parameters.items()
            if parameter is not None and _first(first, prefix + leaf) not in placed
        }
        if source is None:
            _materialise(submodule, prefix, own, init)
        else:
            _buffers_from(submodule, prefix, source)
        for leaf, parameter in own.items():
            name = _first(first, prefix + leaf)
            whole = submodule._parameters[leaf]
            assert whole is not None
            if only and name not in placements:
                placed[name] = nn.Parameter(whole.detach().to("meta"), requires_grad=parameter.requires_grad)
                continue
            if source is None:
                local = local_part(whole.detach(), mesh, placements[name], copy=True)
            else:
                names = (name, *graph.tied.get(name, ()))
                part = source.read(names, whole, _slices(whole.shape, mesh, placements[name]))
                local = _from_local(part.to(mesh.device_type).contiguous(), whole, mesh, placements[name])
            placed[name] = nn.Parameter(local, requires_grad=parameter.requires_grad)
        for leaf, parameter in submodule._parameters.items():
            if parameter is not None:
                submodule._parameters[leaf] = placed[_first(first, prefix + leaf)]
    if source is not None:
        source.finish(module)
    return {name: parameter for name, parameter in placed.items() if name in placements} if only else placed


def _first_names(graph: JointGraph) -> dict[str, str]:
    """Every name of a parameter -> the first one (the plan's)."""
    names = {name: name for name in graph.parameters}
    for name, others in graph.tied.items():
        names.update(dict.fromkeys(others, name))
    return names


def _first(first: Mapping[str, str], name: str) -> str:
    if name not in first:
        raise PlanMismatch(f"model: parameter {name} is not in the captured step; the plan does not place it")
    return first[name]


def _children_first(module: nn.Module, prefix: str = "", seen: set[int] | None = None) -> Iterator[Any]:
    """(prefix, submodule) pairs, each submodule once, its children first (``nn.Module.apply``'s order)."""
    seen = set() if seen is None else seen
    if id(module) in seen:
        return
    seen.add(id(module))
    for name, child in module._modules.items():
        if child is not None:
            yield from _children_first(child, f"{prefix}{name}.", seen)
    yield prefix, module


def _materialise(
    submodule: nn.Module, prefix: str, own: Mapping[str, nn.Parameter], init: Initialiser | None
) -> None:
    """The submodule's own meta parameters (those in ``own``) and meta buffers made whole on the CPU and
    initialised in place: ``init(submodule)``, or its ``reset_parameters()``."""
    meta = [leaf for leaf, parameter in own.items() if parameter.is_meta]
    buffers = [leaf for leaf, buffer in submodule._buffers.items() if buffer is not None and buffer.is_meta]
    if not meta and not buffers:
        return
    kind = type(submodule).__name__
    if buffers and init is None:
        raise ValueError(
            f"buffer {prefix}{buffers[0]} ({kind}) is on the meta device: a buffer is made by its module's "
            "constructor, which autoshard cannot run again; build the model under `autoshard.meta_init()` "
            "(parameters on the meta device, buffers made), or pass init to make it"
        )
    if init is None and not callable(getattr(submodule, "reset_parameters", None)):
        raise ValueError(
            f"parameter {prefix}{meta[0]} is on the meta device and {kind} has no reset_parameters(): pass "
            "init (a function initialising one module's own parameters, e.g. a Hugging Face model's "
            "_init_weights) or weights"
        )
    for leaf in meta:
        held = own[leaf]
        submodule._parameters[leaf] = nn.Parameter(
            torch.empty(held.shape, dtype=held.dtype, device="cpu"), requires_grad=held.requires_grad
        )
    for leaf in buffers:
        held = submodule._buffers[leaf]
        assert held is not None
        submodule._buffers[leaf] = torch.empty(held.shape, dtype=held.dtype, device="cpu")
    with torch.no_grad():
        if init is not None:
            init(submodule)
        else:
            submodule.reset_parameters()  # type: ignore[operator]


def _buffers_from(submodule: nn.Module, prefix: str, source: Weights) -> None:
    """Meta buffers made empty on the CPU for the weights to fill (``Weights.finish``); one the weights do
    not hold cannot be made: say which."""
    for leaf, buffer in submodule._buffers.items():
        if buffer is None or not buffer.is_meta:
            continue
        if not source.has(prefix + leaf):
            raise ValueError(
                f"buffer {prefix}{leaf} ({type(submodule).__name__}) is on the meta device and the weights "
                "do not hold it: build the model under `autoshard.meta_init()` (parameters on the meta "
                "device, buffers made by the constructor)"
            )
        submodule._buffers[leaf] = torch.empty(buffer.shape, dtype=buffer.dtype, device="cpu")


def local_part(whole: torch.Tensor, mesh: DeviceMesh, placements: Placements, copy: bool = False) -> DTensor:
    """The DTensor of a tensor every rank holds whole and alike: each rank keeps its own part, no data moves
    between ranks. Without ``copy`` the part is a view of the whole where it can be (a step's inputs: the
    caller holds them anyway); with it, the part is its own storage and the whole can go (a parameter)."""
    part = whole[_slices(whole.shape, mesh, placements)]
    local = part.to(device=mesh.device_type, copy=copy).contiguous()
    return _from_local(local, whole, mesh, placements)


def _slices(shape: torch.Size, mesh: DeviceMesh, placements: Placements) -> tuple[slice, ...]:
    coordinate = mesh.get_coordinate()
    assert coordinate is not None, "this rank is not on the plan's mesh"
    return part_of(tuple(shape), tuple(mesh.shape), coordinate, _or_replicated(placements, mesh), "parameter")


def slices_of(value: DTensor) -> tuple[slice, ...]:
    """The slices of the whole tensor that this rank's part of ``value`` holds."""
    return _slices(value.shape, value.device_mesh, tuple(value.placements))


def _or_replicated(placements: Placements | None, mesh: DeviceMesh) -> Placements:
    return tuple(placements) if placements else (Replicate(),) * mesh.ndim


def _from_local(
    local: torch.Tensor, whole: torch.Tensor, mesh: DeviceMesh, placements: Placements | None
) -> DTensor:
    stride = torch.empty(whole.shape, device="meta").stride()
    placed = list(_or_replicated(placements, mesh))
    return DTensor.from_local(local, mesh, placed, run_check=False, shape=whole.shape, stride=stride)


class Weights:
    """Weights on disk that a rank reads its own parts of (:func:`open_weights`)."""

    def has(self, name: str) -> bool:
        raise NotImplementedError

    def read(self, names: tuple[str, ...], whole: torch.Tensor, slices: tuple[slice, ...]) -> torch.Tensor:
        """This rank's part (``slices``) of the parameter of these ``names`` (its first, then the others it
        is tied under), in ``whole``'s dtype; ``whole`` (its meta or full tensor) says its shape."""
        raise NotImplementedError

    def finish(self, module: nn.Module) -> None:
        """After every parameter is placed: fill what is filled all at once."""

    def fill_whole(self, module: nn.Module) -> None:
        """Every parameter and held buffer of a module on one process, whole (the one-process run a check
        compares with)."""
        raise NotImplementedError


def open_weights(path: str | Path) -> Weights:
    """A DCP directory (``.metadata``), a safetensors file, or a directory of safetensors files (with a
    ``model.safetensors.index.json`` when there are several)."""
    where = Path(path)
    if (where / ".metadata").is_file():
        return CheckpointWeights(where)
    if where.is_file() and where.suffix == ".safetensors":
        return SafetensorsWeights([where])
    if where.is_dir():
        index = where / "model.safetensors.index.json"
        if index.is_file():
            files = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
            return SafetensorsWeights([where / name for name in files])
        found = sorted(where.glob("*.safetensors"))
        if len(found) == 1:
            return SafetensorsWeights(found)
    raise ValueError(
        f"weights: {path} is neither a torch.distributed.checkpoint directory (.metadata) nor a safetensors "
        "file, nor a directory with one safetensors file or a model.safetensors.index.json"
    )


class SafetensorsWeights(Weights):
    """Safetensors files: each tensor's slices read by rows (:mod:`runtime.safetensors_slices`), nothing
    else held."""

    def __init__(self, files: list[Path]) -> None:
        self.found: dict[str, tuple[Path, Entry]] = {}
        for file in files:
            self.found.update({name: (file, entry) for name, entry in entries(file).items()})

    def has(self, name: str) -> bool:
        return name in self.found

    def read(self, names: tuple[str, ...], whole: torch.Tensor, slices: tuple[slice, ...]) -> torch.Tensor:
        file, entry = self._entry(names, whole)
        return read_slice(file, entry, slices).to(dtype=whole.dtype)

    def _entry(self, names: tuple[str, ...] | list[str], whole: torch.Tensor) -> tuple[Path, Entry]:
        key = next((n for n in names if n in self.found), None)
        if key is None:
            held = ", ".join(sorted(self.found)[:5])
            raise ValueError(
                f"weights: no tensor {names[0]} in the safetensors files (they hold {held}, ...)"
            )
        file, entry = self.found[key]
        if list(entry.shape) != list(whole.shape):
            raise ValueError(
                f"weights: {key} has shape {list(entry.shape)} on disk, the model's {list(whole.shape)}"
            )
        return file, entry

    def fill_whole(self, module: nn.Module) -> None:
        with torch.no_grad():
            for names, tensor, required in _tensors_by_names(module):
                if required or any(name in self.found for name in names):
                    file, entry = self._entry(names, tensor)
                    tensor.copy_(read_slice(file, entry))

    def finish(self, module: nn.Module) -> None:
        """Persistent buffers the files hold (replicated: read whole)."""
        for name, buffer in module.named_buffers():
            if name in self.found:
                owner, _, leaf = name.rpartition(".")
                file, entry = self._entry((name,), buffer)
                module.get_submodule(owner)._buffers[leaf] = read_slice(file, entry).to(dtype=buffer.dtype)


class CheckpointWeights(Weights):
    """A ``torch.distributed.checkpoint`` directory: the parameters are made empty in their placements,
    then DCP fills each rank's pieces (written under any mesh or placements). A checkpoint ``autoshard run
    --save`` wrote (model and optimizer) and a model's own state dict alike."""

    def __init__(self, directory: Path) -> None:
        from torch.distributed.checkpoint import FileSystemReader

        self.directory = directory
        keys = set(FileSystemReader(str(directory)).read_metadata().state_dict_metadata)
        self.prefix = "model." if any(key.startswith("model.") for key in keys) else ""
        self.keys = {key[len(self.prefix) :] for key in keys if key.startswith(self.prefix)}

    def has(self, name: str) -> bool:
        return name in self.keys

    def read(self, names: tuple[str, ...], whole: torch.Tensor, slices: tuple[slice, ...]) -> torch.Tensor:
        """An empty part: DCP fills it in :meth:`finish`."""
        if not any(name in self.keys for name in names):
            raise ValueError(f"weights: no tensor {names[0]} in the checkpoint {self.directory}")
        return torch.empty([piece.stop - piece.start for piece in slices], dtype=whole.dtype)

    def fill_whole(self, module: nn.Module) -> None:
        self.finish(module)

    def finish(self, module: nn.Module) -> None:
        import torch.distributed.checkpoint as dcp

        for names, _, required in _tensors_by_names(module):
            if required and not any(name in self.keys for name in names):
                raise ValueError(f"weights: no tensor {names[0]} in the checkpoint {self.directory}")
        state = {name: value for name, value in module.state_dict().items() if name in self.keys}
        dcp.load({"model": state} if self.prefix else state, checkpoint_id=str(self.directory))
        for name, value in state.items():  # DCP fills tensors in place; a buffer it made anew is set
            owner, _, leaf = name.rpartition(".")
            holder = module.get_submodule(owner)
            if leaf in holder._buffers:
                holder._buffers[leaf] = value


def _tensors_by_names(module: nn.Module) -> list[tuple[list[str], torch.Tensor, bool]]:
    """Each parameter and buffer of ``module`` once: every name it has, the tensor, whether weights must
    hold it (a parameter; a buffer may be made by its module)."""
    found: dict[int, tuple[list[str], torch.Tensor, bool]] = {}
    for name, tensor in module.named_parameters(remove_duplicate=False):
        found.setdefault(id(tensor), ([], tensor, True))[0].append(name)
    for name, tensor in module.named_buffers(remove_duplicate=False):
        found.setdefault(id(tensor), ([], tensor, False))[0].append(name)
    return list(found.values())


__all__ = [
    "Initialiser",
    "Weights",
    "local_part",
    "meta_parameters",
    "open_weights",
    "place_parameters",
    "slices_of",
]
