"""The `autoshard` command line."""

from __future__ import annotations

import atexit
import gc
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Annotated, NoReturn

STARTED = time.perf_counter()
"""When this command began (before its imports): a search's budget counts from here."""

import typer  # noqa: E402  (after STARTED: typer's import is part of what the budget covers)

MODEL_HELP = "mlp, gpt2-small, llama3-8b, llama3-70b, llama3-405b, moe or path/file.py:factory"

app = typer.Typer(
    help="autoshard: whole-graph sharding plans from an integer program, with certified gaps.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

#: Exit codes of `autoshard solve`.
EXIT_OK, EXIT_BAD_INPUT, EXIT_INFEASIBLE = 0, 2, 3

# Options several commands share (plan, export-graph, search): one declaration each.
BatchOption = Annotated[int | None, typer.Option(help="global batch", min=1)]
SeqOption = Annotated[int | None, typer.Option(help="sequence length", min=1)]
LayersOption = Annotated[int | None, typer.Option(help="override the model's depth", min=1)]
DtypeOption = Annotated[
    str, typer.Option("--dtype", "--param-dtype", help="parameter dtype (their gradients' too)")
]
ComputeDtypeOption = Annotated[
    str | None,
    typer.Option(
        "--compute-dtype",
        help="mixed precision: compute on copies of the parameters in this dtype (default: --dtype)",
    ),
]
GapOption = Annotated[
    float, typer.Option(help="stop once proven within this share of the optimum (0: prove)", min=0, max=1)
]
RecomputeOption = Annotated[
    str,
    typer.Option(
        help="activation recomputation: auto (the program chooses), none, selective (keep matmul and "
        "attention outputs) or full (keep each layer's input)"
    ),
]
CapturedLayersOption = Annotated[
    int | None,
    typer.Option(
        "--captured-layers",
        help="capture deep models with this many layers standing for all (0: every layer)",
        min=0,
    ),
]


@app.callback()
def root() -> None:
    """autoshard: whole-graph sharding plans from an integer program, with certified gaps."""


@app.command()
def solve(
    problem: Annotated[Path, typer.Argument(help="IOPDDL problem, .json or .json.gz")],
    backend: Annotated[str, typer.Option(help="cbc, highs, cpsat, heuristic or auto")] = "auto",
    time_limit: Annotated[float, typer.Option("--time-limit", help="seconds", min=0.1)] = 60.0,
    threads: Annotated[int, typer.Option(help="solver threads", min=1)] = 2,
    out: Annotated[Path | None, typer.Option(help="also write the result JSON here")] = None,
    seed: Annotated[int, typer.Option(help="heuristic seed")] = 0,
    no_reductions: Annotated[bool, typer.Option("--no-reductions", help="hand the raw problem over")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress on stderr")] = False,
) -> None:
    """Solve a strategy-selection problem; print the result JSON (progress goes to stderr).

    Exit 0 with a solution, 3 when the problem is infeasible, 2 for bad input.
    """
    from solver.errors import InfeasibleError, ProblemError
    from solver.iopddl import load
    from solver.solve import SolveOptions
    from solver.solve import solve as run_solve

    if backend not in ("cbc", "highs", "cpsat", "heuristic", "auto"):
        _fail(
            f"--backend: unknown backend {backend!r}; choose cbc, highs, cpsat, heuristic or auto",
            EXIT_BAD_INPUT,
        )
    try:
        parsed = load(problem)
    except ProblemError as error:
        _fail(f"bad problem: {error}", EXIT_BAD_INPUT)
    if not quiet:
        typer.echo(f"autoshard: {parsed.summary()}", err=True)
    try:
        result = run_solve(
            parsed,
            SolveOptions(
                backend=backend,
                time_limit=time_limit,
                threads=threads,
                seed=seed,
                use_reductions=not no_reductions,
            ),
            progress=None if quiet else _print_progress,
        )
    except InfeasibleError as error:
        document = {
            "status": "infeasible",
            "solution": None,
            "message": str(error),
            "min_peak": error.min_peak,
        }
        _emit(document, out)
        _fail(f"infeasible: {error}", EXIT_INFEASIBLE)
    document = result.to_dict()
    _emit(document, out)
    if result.solution is None:
        _fail(f"no solution within {time_limit:g} s", EXIT_INFEASIBLE if result.status == "infeasible" else 1)


@app.command("strategies")
def strategies_command(
    op: Annotated[str, typer.Argument(help="aten overload, e.g. aten.mm.default (.default may be left out)")],
    mesh: Annotated[str, typer.Option(help="mesh shape, e.g. 2x2")],
    shapes: Annotated[
        str | None, typer.Option(help="tensor arguments in order, e.g. 64x32,32x16 (all of --dtype)")
    ] = None,
    args: Annotated[
        str | None,
        typer.Option(
            help='positional arguments as JSON; a tensor is {"shape": [64, 32], "dtype": "float32"}'
        ),
    ] = None,
    kwargs: Annotated[
        str | None, typer.Option(help="keyword arguments as a JSON object, same notation")
    ] = None,
    dtype: Annotated[
        str, typer.Option(help="dtype of --shapes tensors, and of --args tensors without one")
    ] = "float32",
    axis_names: Annotated[str | None, typer.Option("--axis-names", help="e.g. dp,tp")] = None,
    hardware: Annotated[str, typer.Option(help="h100, h200, a100, b200, cpu or a .json/.yaml file")] = "h100",
    as_json: Annotated[bool, typer.Option("--json", help="print a JSON list instead of a table")] = False,
) -> None:
    """List an op's sharding strategies on a mesh, with compute, memory and redistribution costs.

    Exit 0 with the list, 2 for bad input (the message names the option), 1 if generation itself fails.
    """
    from service import strategies_view as view

    try:
        request = view.parse_request(op, shapes, args, kwargs, dtype, mesh, axis_names, hardware)
        result = view.generate(request)
    except view.BadInput as error:
        _fail(str(error), EXIT_BAD_INPUT)
    except Exception as error:  # a bug in a rule: one line, not a traceback
        first_line = (str(error).splitlines() or [""])[0]
        _fail(f"strategies for {op} failed: {type(error).__name__}: {first_line}", 1)
    if as_json:
        _emit(view.as_records(result), None)
    else:
        typer.echo(view.as_table(request, result))


@app.command("plan")
def plan_command(
    mesh: Annotated[str, typer.Option(help="mesh shape, e.g. 2x4")],
    out: Annotated[Path, typer.Option(help="write the plan JSON here")],
    model: Annotated[
        str | None,
        typer.Option(help=MODEL_HELP),
    ] = None,
    graph: Annotated[
        Path | None,
        typer.Option(help="plan a graph written by `autoshard export-graph` instead of a model"),
    ] = None,
    axis_names: Annotated[str | None, typer.Option("--axis-names", help="e.g. dp,tp")] = None,
    memory_gib: Annotated[float | None, typer.Option("--memory-gib", help="per-device budget, GiB")] = None,
    hardware: Annotated[str, typer.Option(help="h100, h200, a100, b200, cpu or a .json/.yaml file")] = "h100",
    batch: BatchOption = None,
    seq: SeqOption = None,
    layers: LayersOption = None,
    dtype: DtypeOption = "bfloat16",
    compute_dtype: ComputeDtypeOption = None,
    backend: Annotated[str, typer.Option(help="cbc, highs, cpsat, heuristic or auto")] = "auto",
    time_limit: Annotated[float, typer.Option("--time-limit", help="solver seconds", min=0.1)] = 60.0,
    gap: GapOption = 0.01,
    captured_layers: CapturedLayersOption = 4,
    baseline: Annotated[
        str | None,
        typer.Option(help="plan a hand-written layout instead: ddp, fsdp, hsdp, megatron or fsdp_tp"),
    ] = None,
    recompute: RecomputeOption = "auto",
    microbatches: Annotated[
        int | None,
        typer.Option(help="a pipeline (axis pp first): micro-batches per step (default: chosen)", min=1),
    ] = None,
    schedule: Annotated[
        str | None,
        typer.Option(
            help="a pipeline's schedule: 1f1b, zero-bubble, interleaved-1f1b or gpipe (default: chosen)"
        ),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress on stderr")] = False,
) -> None:
    """Plan a model on a mesh: capture one training step, solve the whole-graph program, write the plan.

    Prints a summary (placements by layer, step time, memory against the budget, certificate); exit 0 with
    a plan, 3 when no plan fits the memory budget, 2 for bad input.
    """
    from service.plan_view import summary
    from solver.errors import InfeasibleError
    from strategies.plan.planner import PlanRequest, plan_model

    if (model is None) == (graph is None):
        _fail("--model / --graph: give exactly one of them", EXIT_BAD_INPUT)
    request = PlanRequest(
        model=model or "",
        graph=None if graph is None else _read_graph(graph),
        mesh=mesh,
        axis_names=axis_names,
        hardware=hardware,
        memory_gib=memory_gib,
        batch=batch,
        seq=seq,
        layers=layers,
        dtype=dtype,
        compute_dtype=compute_dtype,
        backend=backend,
        time_limit=time_limit,
        gap=gap,
        captured_layers=captured_layers or None,
        baseline=baseline,
        recompute=recompute,
        microbatches=microbatches,
        schedule=schedule,
    )
    say = (lambda message: None) if quiet else (lambda message: typer.echo(message, err=True))
    try:
        outcome = plan_model(request, progress=say)
    except InfeasibleError as error:
        _fail(str(error), EXIT_INFEASIBLE)
    except (ValueError, FileNotFoundError) as error:
        _fail(str(error), EXIT_BAD_INPUT)
    out.write_text(json.dumps(outcome.plan, indent=1) + "\n", encoding="utf-8")
    typer.echo(summary(outcome.plan))
    typer.echo(f"plan written to {out}")


@app.command("export-graph")
def export_graph_command(
    model: Annotated[str, typer.Option(help=MODEL_HELP)],
    out: Annotated[Path, typer.Option("--out", "-o", help="write the graph JSON here")],
    batch: BatchOption = None,
    seq: SeqOption = None,
    layers: LayersOption = None,
    dtype: DtypeOption = "bfloat16",
    compute_dtype: ComputeDtypeOption = None,
    captured_layers: CapturedLayersOption = 4,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress on stderr")] = False,
) -> None:
    """Write a model's captured training step as a graph document (docs/graph-format.md, version 1).

    `autoshard plan --graph FILE` and the service plan from it without the model's code, exactly as from
    the model with the same shape options. Exit 0, 2 for bad input.
    """
    from strategies.graph.export import graph_json
    from strategies.plan.planner import PlanRequest, export_request_graph

    request = PlanRequest(
        model=model,
        mesh="1",
        batch=batch,
        seq=seq,
        layers=layers,
        dtype=dtype,
        compute_dtype=compute_dtype,
        captured_layers=captured_layers or None,
    )
    say = (lambda message: None) if quiet else (lambda message: typer.echo(message, err=True))
    try:
        text = graph_json(export_request_graph(request, say))
    except (ValueError, FileNotFoundError) as error:
        _fail(str(error), EXIT_BAD_INPUT)
    out.write_text(text + "\n", encoding="utf-8")
    typer.echo(f"graph written to {out} ({len(text):,} bytes)")


def _read_graph(path: Path) -> dict:
    """A graph document from a file, refused (exit 2) when it breaks the format's bounds or is not JSON."""
    from strategies.graph.graph_format import GraphFormatError
    from strategies.graph.imported import read_graph

    if not path.is_file():
        _fail(f"--graph: no file {path}", EXIT_BAD_INPUT)
    try:
        return read_graph(path.read_bytes())
    except GraphFormatError as error:
        _fail(f"--graph {path}: {error}", EXIT_BAD_INPUT)


@app.command("explain")
def explain_command(
    plan: Annotated[Path, typer.Argument(help="plan JSON written by `autoshard plan`")],
    target: Annotated[str, typer.Argument(help="a parameter name (e.g. w1.weight), NAME.grad or an op node")],
    as_json: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress on stderr")] = False,
) -> None:
    """Why a placement: its cost (compute, communication in and out) and the next-best alternatives.

    The plan's problem is rebuilt from its request; exit 0 with the report, 2 for an unknown target or a bad
    plan file.
    """
    from strategies.plan.explain import UnknownTarget, explain_plan_file, explain_text

    if not plan.is_file():
        _fail(f"no plan file {plan}", EXIT_BAD_INPUT)
    say = (lambda message: None) if quiet else (lambda message: typer.echo(message, err=True))
    try:
        report = explain_plan_file(plan, target, progress=say)
    except UnknownTarget as error:
        _fail(str(error), EXIT_BAD_INPUT)
    except (ValueError, KeyError, TypeError) as error:  # not JSON, no request, an old request
        _fail(f"cannot explain {plan}: {type(error).__name__}: {error}", EXIT_BAD_INPUT)
    if as_json:
        _emit(report, None)
    else:
        typer.echo(explain_text(report))


@app.command("run")
def run_command(
    model: Annotated[
        str, typer.Option(help="the model the plan was made for (name or path/file.py:factory)")
    ],
    plan: Annotated[Path, typer.Option(help="plan JSON written by `autoshard plan`")],
    nproc: Annotated[
        int | None, typer.Option(help="ranks to start (default: the plan's mesh size)", min=1)
    ] = None,
    backend: Annotated[str, typer.Option(help="gloo (CPU) or nccl (GPU)")] = "gloo",
    device: Annotated[str, typer.Option(help="cpu or cuda")] = "cpu",
    steps: Annotated[int, typer.Option(help="training steps", min=1)] = 1,
    optimizer: Annotated[str, typer.Option(help="sgd or adamw")] = "sgd",
    lr: Annotated[float, typer.Option(help="learning rate", min=0)] = 1e-3,
    seed: Annotated[int, typer.Option(help="seed of the built-in models' weights and inputs")] = 0,
    check: Annotated[
        bool, typer.Option("--check", help="compare loss, gradients and parameters with one process")
    ] = False,
    report: Annotated[Path | None, typer.Option(help="write the report JSON here")] = None,
    save: Annotated[
        Path | None, typer.Option(help="write a sharded checkpoint here after the last step")
    ] = None,
    load: Annotated[Path | None, typer.Option(help="start from a sharded checkpoint (of any plan)")] = None,
    meta_init: Annotated[
        bool,
        typer.Option(
            "--meta-init",
            help="build on the meta device: each rank initialises only its own shards (from --seed)",
        ),
    ] = False,
    weights: Annotated[
        Path | None,
        typer.Option(help="each rank reads only its own shards of these weights (DCP folder or safetensors)"),
    ] = None,
) -> None:
    """Apply a plan with DTensor on N ranks and train; inside `torchrun`, run as one of its ranks.

    With --meta-init or --weights no rank ever holds the whole model; --check then runs the one-process
    model in a process of its own on the first rank's host.

    Prints the report (loss per step, step time, collectives measured vs predicted); exit 0, 1 when a rank
    failed or --check found a difference (naming the tensor), 2 for bad input (a plan for another model,
    mesh, version or world size).
    """
    _collect_as_python_does()
    from runtime.launch import RunFailed, run
    from runtime.plan_checks import PlanMismatch
    from runtime.report import report_text
    from runtime.worker import RunOptions

    if optimizer not in ("sgd", "adamw"):
        _fail(f"--optimizer: unknown optimizer {optimizer!r}; choose sgd or adamw", EXIT_BAD_INPUT)
    options = RunOptions(
        model=model,
        plan=str(plan),
        steps=steps,
        optimizer=optimizer,
        lr=lr,
        check=check,
        report=None if report is None else str(report.resolve()),
        save=None if save is None else str(save.resolve()),
        load=None if load is None else str(load.resolve()),
        seed=seed,
        device=device,
        backend=backend,
        meta_init=meta_init,
        weights=None if weights is None else str(weights.resolve()),
    )
    try:
        result = run(options, nproc)
    except PlanMismatch as error:
        _fail(str(error), EXIT_BAD_INPUT)
    except RunFailed as error:
        _fail(str(error), error.exit_code)
    if int(os.environ.get("RANK", "0")) == 0:  # inside torchrun every rank has the report
        typer.echo(report_text(result))


@app.command("search")
def search_command(
    model: Annotated[str, typer.Option(help=MODEL_HELP)],
    devices: Annotated[int, typer.Option(help="devices to lay the model over", min=1)],
    out: Annotated[Path, typer.Option(help="results folder (results.json, results.csv, plans/)")] = Path(
        "search-results"
    ),
    hardware: Annotated[str, typer.Option(help="h100, h200, a100, b200, cpu or a .json/.yaml file")] = "h100",
    memory_gib: Annotated[float | None, typer.Option("--memory-gib", help="per-device budget, GiB")] = None,
    batch_sizes: Annotated[str, typer.Option("--batch-sizes", help="global batches, e.g. 8,16,32")] = "8",
    seq: SeqOption = None,
    layers: LayersOption = None,
    options: Annotated[
        str | None, typer.Option(help="model configuration overrides as JSON, e.g. '{\"dim\": 128}'")
    ] = None,
    dtype: DtypeOption = "bfloat16",
    compute_dtype: ComputeDtypeOption = None,
    max_mesh_dims: Annotated[
        int,
        typer.Option("--max-mesh-dims", help="mesh axes at most (4: pipelines, pp,dp,cp,tp)", min=1, max=4),
    ] = 3,
    max_axis: Annotated[
        str | None,
        typer.Option("--max-axis", help="largest size per axis role, e.g. tp=8 or tp=8,pp=16 (default: any)"),
    ] = None,
    executor: Annotated[
        str, typer.Option(help="local (a process pool) or ray (also when RAY_ADDRESS is set)")
    ] = ("local"),
    workers: Annotated[
        int | None, typer.Option(help="candidates planned at once (default: cores)", min=1)
    ] = None,
    time_limit: Annotated[
        float, typer.Option("--time-limit", help="solver seconds per candidate at most", min=0.1)
    ] = 60.0,
    budget: Annotated[
        float,
        typer.Option(
            help="the search's wall seconds: each solver's limit set from the time left (0: none)", min=0
        ),
    ] = 60.0,
    gap: GapOption = 0.01,
    backend: Annotated[str, typer.Option(help="cbc, highs, cpsat, heuristic or auto")] = "auto",
    cache: Annotated[
        str | None,
        typer.Option(
            help="the service's database URL: reuse its plans and store new ones (AUTOSHARD_DATABASE_URL)"
        ),
    ] = None,
    top: Annotated[int, typer.Option(help="rows of the ranking table", min=1)] = 10,
    recompute: RecomputeOption = "auto",
    prune: Annotated[
        bool, typer.Option(help="stop a candidate once its bound proves it cannot beat the best so far")
    ] = True,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress on stderr")] = False,
) -> None:
    """Plan every mesh of N devices (1 to --max-mesh-dims axes) times the batch sizes; rank by throughput.

    Writes results.json, results.csv, plans/<id>.json and report.html (when the report module is there)
    under --out, and prints the ranking. Exit 0 when the search ran (infeasible and failed candidates are
    reported in the results), 2 for bad input.
    """
    from rich.console import Console

    from service.search.candidates import parse_axis_limits
    from service.search.display import SearchProgress, ranking_table, status_counts
    from service.search.pruning import proof_text
    from service.search.report.page import write_report
    from service.search.request import SearchRequest
    from service.search.runner import run_search

    try:
        request = SearchRequest(
            model=model,
            devices=devices,
            hardware=hardware,
            memory_gib=memory_gib,
            batch_sizes=_int_list(batch_sizes, "--batch-sizes"),
            seq=seq,
            max_mesh_dims=max_mesh_dims,
            axis_limits=parse_axis_limits(max_axis or ""),
            executor="ray" if os.environ.get("RAY_ADDRESS") else executor,
            workers=workers or os.cpu_count() or 1,
            time_limit_s=time_limit,
            budget_s=budget or None,
            gap=gap,
            backend=backend,
            dtype=dtype,
            compute_dtype=compute_dtype,
            layers=layers,
            options=json.loads(options) if options else {},
            recompute=recompute,
            prune=prune,
        )
    except (ValueError, json.JSONDecodeError) as error:
        _fail(str(error), EXIT_BAD_INPUT)
    console = Console(stderr=True, quiet=quiet, width=None if sys.stderr.isatty() else 160)
    progress = SearchProgress(console)
    cache_url = cache or os.environ.get("AUTOSHARD_DATABASE_URL")
    try:
        results = run_search(
            request, out, progress, cache_url=cache_url, say=console.print, budget_from=STARTED
        )
    except ValueError as error:
        _fail(str(error), EXIT_BAD_INPUT)
    finally:
        progress.stop()
    report = write_report(results, out)
    Console(width=None if sys.stdout.isatty() else 160).print(ranking_table(results, top))
    counts = ", ".join(f"{n} {status}" for status, n in status_counts(results).items())
    typer.echo(proof_text(results.get("proof")))
    typer.echo(f"{counts}; results in {out / 'results.json'}" + (f", report {report}" if report else ""))


def _int_list(text: str, option: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        _fail(f"{option}: expected integers joined by commas such as 8,16,32, got {text!r}", EXIT_BAD_INPUT)
    return values


@app.command("serve")
def serve_command(
    host: Annotated[str | None, typer.Option(help="address to listen on [env AUTOSHARD_HOST]")] = None,
    port: Annotated[int | None, typer.Option(help="port [env AUTOSHARD_PORT]", min=0, max=65535)] = None,
    workers: Annotated[
        int | None, typer.Option(help="solver worker processes [env AUTOSHARD_WORKERS]", min=0)
    ] = None,
    database_url: Annotated[
        str | None,
        typer.Option(
            "--database-url", help="SQLAlchemy URL, SQLite file or PostgreSQL [env AUTOSHARD_DATABASE_URL]"
        ),
    ] = None,
    log_level: Annotated[str, typer.Option("--log-level", help="uvicorn's log level")] = "info",
) -> None:
    """Run the REST service (/v1, OpenAPI at /openapi.json, /healthz, /readyz, /metrics) with its workers.

    Every setting is read from the environment (AUTOSHARD_*, see README); options override them.
    """
    _collect_as_python_does()
    import logging

    import uvicorn

    from service.app.main import create_app
    from service.settings import Settings

    overrides = {"host": host, "port": port, "workers": workers, "database_url": database_url}
    settings = Settings(**{key: value for key, value in overrides.items() if value is not None})
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level=log_level)


def _print_progress(phase: str, seconds: float, incumbent: float, bound: float) -> None:
    gap = (
        (incumbent - bound) / incumbent
        if math.isfinite(incumbent) and math.isfinite(bound) and incumbent
        else None
    )
    gap_text = f"{100 * gap:.3f}%" if gap is not None else "-"
    typer.echo(
        f"[{seconds:8.2f}s] {phase:<9} incumbent {_fmt(incumbent):>18}  "
        f"bound {_fmt(bound):>18}  gap {gap_text}",
        err=True,
    )


def _fmt(value: float) -> str:
    if not math.isfinite(value):
        return "-"
    return f"{value:,.0f}" if value == round(value) and abs(value) < 1e15 else f"{value:.6g}"


def _emit(document: dict, out: Path | None) -> None:
    text = json.dumps(document, indent=None, separators=(",", ": "))
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
    if out is not None:
        out.write_text(text + "\n", encoding="utf-8")


def _fail(message: str, code: int) -> NoReturn:
    typer.echo(f"autoshard: {message}", err=True)
    raise typer.Exit(code)


GC_THRESHOLDS = (100_000, 50, 100)
"""The cyclic collector's thresholds in a one-shot command's process (Python's: 700, 10, 10). Importing torch
and tracing a model on fake tensors make millions of objects that live to the end; at the default thresholds
the collector walks them again and again: 0.7-1.0 s of `autoshard plan` llama3-8b 8x8's 4.8-5.4 s (4.2 s with
these, 4.0 s with no collection at all). Young cycles are still collected, far less often, old ones hardly:
the long-lived commands (`serve`, `run`) go back to Python's thresholds (`_collect_as_python_does`)."""
PYTHON_GC_THRESHOLDS = gc.get_threshold()


def _collect_as_python_does() -> None:
    """Python's own collector thresholds, for a process that lives long (a server, training steps): under
    `GC_THRESHOLDS` the oldest generation would almost never be collected."""
    gc.set_threshold(*PYTHON_GC_THRESHOLDS)


def main() -> None:
    """The `autoshard` command: the app, and an exit that skips the interpreter's teardown.

    Freeing every module and object of a run that imported torch takes 0.3-0.7 s after the command is done
    (measured on `autoshard plan`: a sixth of its wall time). Every other exit handler still runs (they were
    registered after this one, and run first); then the streams are flushed and the process ends with the
    command's exit code. Files are written whole and closed by the commands themselves.
    """
    gc.set_threshold(*GC_THRESHOLDS)
    exit_code = 0

    def finish() -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_code)

    atexit.register(finish)
    try:
        app()
    except SystemExit as done:
        exit_code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        raise
    except BaseException:  # a crash: its traceback is printed before the exit handlers run
        exit_code = 1
        raise


if __name__ == "__main__":
    main()
