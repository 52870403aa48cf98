"""Train a `transformers` Llama with autoshard inside your own `torchrun` loop.

    # 4 ranks: plan (rank 0 solves, every rank gets the plan), build on the meta device (each rank makes only
    # its own shards), train 10 steps and save a sharded checkpoint
    torchrun --standalone --nproc-per-node 4 examples/train.py --mesh 2x2 --stop-after 10 --save ckpt
    # go on to step 20 under another plan: each rank reads only its own pieces of the checkpoint
    torchrun --standalone --nproc-per-node 4 examples/train.py --mesh 4 --baseline megatron --resume ckpt
    # the same 20 steps on one process, plain PyTorch: the losses to compare with
    python examples/train.py --steps 20

What a launcher does, step by step: a real ``DataLoader`` with a ``DistributedSampler`` gives each rank the
rows of the global batch the plan places on it (``plan.input_slices``); AdamW over ``model.parameters()``
(the DTensor parameters ``autoshard.apply`` made) with a warm-up + cosine LR schedule; a
``torch.distributed.checkpoint`` of the model, the optimizer and the schedule, resumable under any plan.
``--service URL`` fetches the plan from an autoshard service instead (``autoshard.Client``). On GPUs:
``--backend nccl --device cuda --hardware h100``.

The data: byte-level tokens of a synthetic text of additions ("12 + 7 = 19"), made from ``--seed``. Every run
draws the same global batches (the sampler's permutation does not depend on the number of replicas; only
their order inside a batch does, which the mean loss does not see), so all runs' losses are comparable.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_optimizer_state_dict
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from transformers import LlamaConfig, LlamaForCausalLM

import autoshard

VOCAB = 256  # bytes


class Additions(Dataset):
    """Windows of ``seq`` byte tokens over a text of random additions, one line each."""

    def __init__(self, seq: int, windows: int, seed: int) -> None:
        draw = random.Random(seed)
        text = ""
        while len(text) < seq * windows:
            a, b = draw.randrange(100), draw.randrange(100)
            text += f"{a} + {b} = {a + b}\n"
        tokens = torch.tensor(list(text.encode()), dtype=torch.long)
        self.windows = tokens[: seq * windows].view(windows, seq)

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.windows[index]


def build_model() -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config)


def batches(loader: DataLoader, sampler: DistributedSampler, skip: int) -> Iterator[torch.Tensor]:
    """The loader's batches epoch after epoch (the sampler reshuffled per epoch), the first ``skip`` left
    out (a resumed run starts where the checkpoint stopped)."""
    epoch, seen = 0, 0
    while True:
        sampler.set_epoch(epoch)
        for batch in loader:
            if seen >= skip:
                yield batch
            seen += 1
        epoch += 1


def schedule(step: int, warmup: int, total: int) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak LR."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, progress)))


def loader_for(data: Dataset, rows: slice, batch: int, seed: int) -> tuple[DataLoader, DistributedSampler]:
    """A loader of this rank's rows of each global batch: the plan gives every data-parallel replica a
    contiguous block of rows, ``rows`` (ranks that share a block, e.g. along a tensor-parallel axis, load
    the same samples)."""
    local = rows.stop - rows.start
    sampler = DistributedSampler(
        data, num_replicas=batch // local, rank=rows.start // local, shuffle=True, seed=seed, drop_last=True
    )
    return DataLoader(data, batch_size=local, sampler=sampler, drop_last=True), sampler


def get_plan(
    model: torch.nn.Module, example: dict[str, torch.Tensor], mesh: Any, args: Any
) -> autoshard.Plan:
    """The plan: solved here (rank 0; every rank gets it), or fetched from an autoshard service."""
    if args.service is None:
        return autoshard.plan(
            model, example, mesh, hardware=args.hardware, baseline=args.baseline, time_limit=args.time_limit
        )
    answer: list[Any] = [None]
    if dist.get_rank() == 0:
        mesh_fields = {"shape": list(mesh.shape), "axis_names": list(mesh.mesh_dim_names or ()) or None}
        request = {
            "graph": autoshard.export_graph(model, example),
            "mesh": mesh_fields,
            "hardware": args.hardware,
        }
        request |= {"baseline": args.baseline} if args.baseline else {}
        try:
            with autoshard.Client(args.service) as client:
                answer[0] = client.plan(request, timeout_s=600)
        except Exception as error:  # every rank stops with rank 0's error, none waits for it
            answer[0] = error
    dist.broadcast_object_list(answer, src=0)
    if isinstance(answer[0], Exception):
        raise answer[0]
    return autoshard.Plan(answer[0])


def save(directory: str, model: torch.nn.Module, optimizer: Any, scheduler: Any, step: int) -> None:
    """Model, optimizer and schedule: each rank writes its own pieces."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    train = {"step": step, "scheduler": json.dumps(scheduler.state_dict())}
    dcp.save({"model": model_state, "optimizer": optimizer_state, "train": train}, checkpoint_id=directory)


def resume(directory: str, model: torch.nn.Module, optimizer: Any, scheduler: Any) -> int:
    """The optimizer and the schedule from the checkpoint (the model read them when the plan was applied:
    ``weights=``); the step to go on from."""
    _, optimizer_state = get_state_dict(model, optimizer)
    state = {"optimizer": optimizer_state, "train": {"step": 0, "scheduler": ""}}
    dcp.load(state, checkpoint_id=directory)
    set_optimizer_state_dict(model, optimizer, optim_state_dict=state["optimizer"])
    scheduler.load_state_dict(json.loads(state["train"]["scheduler"]))
    return int(state["train"]["step"])


def optimizer_and_schedule(model: torch.nn.Module, args: Any) -> tuple[Any, Any]:
    """AdamW over the model's parameters (DTensors once a plan is applied) and its LR schedule: the ranks'
    run and the one-process run alike."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: schedule(s, args.warmup, args.steps))
    return optimizer, scheduler


def additions(args: Any) -> Additions:
    """The data set: eight global batches of windows, then the sampler reshuffles."""
    return Additions(args.seq, windows=args.batch * 8, seed=args.seed)


def train_distributed(args: Any) -> list[float]:
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group(args.backend)
    shape = tuple(int(size) for size in args.mesh.split("x"))
    names = tuple(args.axis_names.split(",")) if args.axis_names else None
    mesh = init_device_mesh(args.device, shape, mesh_dim_names=names)
    with autoshard.meta_init():  # parameters on the meta device: nothing allocated, nothing drawn
        model = build_model()
    example = {"input_ids": torch.zeros(args.batch, args.seq, dtype=torch.long)}
    example["labels"] = torch.zeros(args.batch, args.seq, dtype=torch.long)
    plan = get_plan(model, example, mesh, args)
    if dist.get_rank() == 0:
        print(plan.summary(), flush=True)
    torch.manual_seed(args.seed)  # each rank draws the whole model's numbers and keeps its own shards
    step = autoshard.apply(model, plan, mesh, example, init=model._init_weights, weights=args.resume)
    optimizer, scheduler = optimizer_and_schedule(model, args)
    start = resume(args.resume, model, optimizer, scheduler) if args.resume else 0
    slices = step.input_slices()  # this rank's part of each input: rows, then (if sharded) columns
    data = additions(args)
    loader, sampler = loader_for(data, slices[0][0], args.batch, args.seed)
    losses = []
    stop = args.stop_after or args.steps
    for index, tokens in zip(range(start, stop), batches(loader, sampler, start), strict=False):
        parts = {name: tokens[(slice(None), *cut[1:])] for name, cut in zip(example, slices, strict=True)}
        result = step(parts, local=True)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(result.loss.full_tensor()))
        if dist.get_rank() == 0:
            print(f"step {index}: loss {losses[-1]:.4f} lr {scheduler.get_last_lr()[0]:.2e}", flush=True)
        if args.save and index + 1 == stop:
            save(args.save, model, optimizer, scheduler, index + 1)
    dist.destroy_process_group()
    return losses


def train_one_process(args: Any) -> list[float]:
    """The same steps as plain PyTorch: the whole model, the whole global batch, ``loss.backward()``."""
    model = build_model()
    torch.manual_seed(args.seed)
    model.apply(model._init_weights)  # the draws the ranks make, in the order they make them
    optimizer, scheduler = optimizer_and_schedule(model, args)
    data = additions(args)
    loader, sampler = loader_for(data, slice(0, args.batch), args.batch, args.seed)
    losses = []
    for index, tokens in zip(range(args.steps), batches(loader, sampler, 0), strict=False):
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        print(f"step {index}: loss {losses[-1]:.4f} lr {scheduler.get_last_lr()[0]:.2e}", flush=True)
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mesh", default="4", help="mesh shape, e.g. 2x2 (under torchrun)")
    parser.add_argument("--axis-names", default=None, help="e.g. dp,tp")
    parser.add_argument("--baseline", default=None, help="pin a layout: ddp, fsdp, megatron, fsdp_tp")
    parser.add_argument("--hardware", default="cpu", help="the cost model's preset, e.g. h100")
    parser.add_argument("--time-limit", type=float, default=20.0, help="the solver's limit, seconds")
    parser.add_argument(
        "--service", default=None, help="fetch the plan from an autoshard service at this URL"
    )
    parser.add_argument("--steps", type=int, default=20, help="steps of the whole run (the LR schedule's)")
    parser.add_argument("--stop-after", type=int, default=None, help="stop after this many (then --save)")
    parser.add_argument("--batch", type=int, default=8, help="global batch (sequences)")
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save", default=None, help="write a sharded checkpoint here after the last step")
    parser.add_argument("--resume", default=None, help="go on from this checkpoint (written under any plan)")
    parser.add_argument("--losses", default=None, help="write the losses by step here (JSON)")
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    distributed = "RANK" in os.environ
    losses = train_distributed(args) if distributed else train_one_process(args)
    if args.losses and int(os.environ.get("RANK", "0")) == 0:
        first = (args.stop_after or args.steps) - len(losses)
        Path(args.losses).write_text(json.dumps({first + k: loss for k, loss in enumerate(losses)}) + "\n")


if __name__ == "__main__":
    main()
