"""``ftui estimate``: per-device memory of a run under every strategy, and the strategy to use.

Everything printed is an estimate from ``runner.planner`` (formulas in docs/memory-model.md);
``--probe`` instead measures the largest micro-batch with short real runs (the batch-size finder).
"""

from __future__ import annotations

import argparse
import json
import textwrap
from dataclasses import replace
from typing import Any

import psutil
from rich.console import Console
from rich.table import Table
from rich.text import Text

from runner import planner as E
from runner.analysis.track_record import host_track_record
from runner.hardware import NvmlBackend
from runner.planner.error_band import key_of
from runner.planner.memory import DEFAULT_RESERVE
from runner.service import decisions, switch_report
from runner.service.batch import BatchTrial, find_batch_size
from runner.service.decisions import PastDecision
from runner.spec import strategies
from runner.spec.recipe import Recipe, RecipeError, load_recipe
from runner.spec.units import parse_bytes
from runner.watch import library
from runner.watch.host import runs_on_cpu
from runner.watch.preflight import preflight
from tui.cli.common import open_store
from tui.cli.exits import UsageError, fail
from tui.cli.parser import SHAPE_FLAGS
from tui.render.estimate import estimate_table, library_line
from tui.render.report import fmt_bytes


def _nvml_gpus() -> list[int]:
    """Total memory of each visible GPU, from NVML (empty without NVML)."""
    try:
        return [int(g.mem_total) for g in NvmlBackend().gpu_infos() if g.mem_total]
    except Exception:  # noqa: BLE001 (no NVML: the caller asks for --gpu-mem)
        return []


def cmd_estimate(args: argparse.Namespace) -> int:
    if args.probe:
        return _probe(args)
    shape_flags = [f"--{f.replace('_', '-')}" for f in SHAPE_FLAGS if getattr(args, f) is not None]
    if args.recipe is not None and (shape_flags or args.model):
        fail(f"estimate: {', '.join(shape_flags or ['--model'])} cannot be combined with a recipe (the recipe "
              "names its model); give one or the other")
    if args.model and shape_flags:
        fail(f"estimate: {', '.join(shape_flags)} cannot be combined with --model (its config gives the sizes)")
    if args.recipe is None and args.model is None and args.params is None:
        fail("estimate: give a recipe file, --model NAME or --params N"
              + (f" ({', '.join(shape_flags)} {'needs' if len(shape_flags) == 1 else 'need'} --params)"
                 if shape_flags else ""))
    if args.overrides and args.recipe is None:
        fail("estimate: --set overrides a recipe's fields; give a recipe file")
    if args.library:
        _library_flags(args)
    notes: list[str] = []
    inp, recipe = _model_input(args, notes)
    if (warning := _approximate_note(inp.shape)) is not None:
        notes.insert(0, warning)
    if args.micro_batch is not None:
        inp = replace(inp, micro_batch=args.micro_batch)
    if args.seq is not None:
        inp = replace(inp, seq_len=args.seq)
    if args.grad_ckpt:
        inp = replace(inp, gradient_checkpointing=True)
    if args.offload_optimizer:
        inp = replace(inp, offload_optimizer=True)
    if args.offload_params:
        inp = replace(inp, offload_params=True)
    if getattr(args, "engine", None):
        inp = replace(inp, engine=args.engine)
    if args.attn:
        inp = replace(inp, attention=args.attn)
    if args.compile:
        inp = replace(inp, compiled=True)
    nvml = _nvml_gpus()
    on_host = not args.gpu_mem and not nvml  # no GPU to plan for: the processes train on this host's CPU
    try:
        reserve = E.parse_bytes(args.reserve or ("0" if on_host else DEFAULT_RESERVE), allow_zero=True)
    except ValueError as exc:
        return fail(f"--reserve: {exc}")
    inp = replace(inp, reserve_bytes=reserve)
    if args.reserve:
        notes.append(f"reserve: {reserve / E.GIB:.1f} GiB per device (--reserve)")
    elif on_host:
        notes.append("reserve: none (no GPU: no CUDA context or allocator slack to hold; --reserve to add one)")
    else:
        notes.append(f"reserve: {reserve / E.GIB:.1f} GiB per GPU for the CUDA context, NCCL and allocator slack "
                     f"(default {DEFAULT_RESERVE}; --reserve to change)")

    if args.gpu_mem:
        try:
            gpu_mem = E.parse_bytes(args.gpu_mem)
        except ValueError as exc:
            return fail(f"--gpu-mem: {exc}")
        notes.append(f"GPU memory: {args.gpu_mem} (--gpu-mem)")
    elif nvml:
        gpu_mem = min(nvml)
        notes.append(f"GPU memory: {gpu_mem / E.GIB:.1f} GiB (NVML, smallest of {len(nvml)} GPUs)")
    else:
        # No GPU here: a run on this machine trains on the CPU, whose budget is the host's memory.
        gpu_mem = int(psutil.virtual_memory().total)
        notes.append(f"no GPU visible (NVML): budget per device = host memory {gpu_mem / E.GIB:.1f} GiB (psutil); "
                     "--gpu-mem SIZE plans for a GPU instead")
    n_gpus = args.gpus or len(nvml) or (recipe.launch.nproc if recipe is not None else 1)
    chosen = args.strategy or strategies.names()
    report = E.estimate_report(inp, gpu_mem, n_gpus, chosen, on_host=on_host)
    _add_track_record(args, report, inp)
    report["measured_here"] = [d.json() for d in _past_decisions(args, recipe, inp)]
    _add_switches(args, report, recipe, inp)
    if recipe is not None:  # the maths library's line: measured by --library, else from this host's cache
        report["library"] = (library.calibrate(recipe, args.recipe, args.overrides) if args.library
                             else library.cached_term(recipe))
    if args.format == "json":
        print(json.dumps(report, indent=2))
        return 0
    _print_text(report, inp, gpu_mem, n_gpus, notes)
    return 0


LIBRARY_REFUSES = ("method", "precision", "lora_r", "micro_batch", "seq", "grad_ckpt", "attn", "compile", "params",
                   "model")
"""Flags that change what a recipe trains: ``--library`` measures the recipe (``--set`` changes its fields)."""


def _library_flags(args: argparse.Namespace) -> None:
    """``--library`` needs a recipe as it will run: one line naming a flag that changes it."""
    if args.recipe is None:
        fail("estimate --library: needs a recipe file (the probe trains its model for two steps)")
    given = [f"--{f.replace('_', '-')}" for f in LIBRARY_REFUSES if getattr(args, f, None)]
    if given:
        fail(f"estimate --library: {', '.join(given)} change what the recipe trains; the probe measures the "
             "recipe as it runs (change its fields with --set FIELD=VALUE)")


def _past_decisions(args: argparse.Namespace, recipe: Recipe | None, inp: E.EstimateInput) -> list[PastDecision]:
    """What ``ftui plan`` measured here for this recipe as written (none when flags change what it trains, or
    without a store)."""
    changed = (args.method, args.precision, args.lora_r, args.micro_batch, args.seq)
    if recipe is None or any(v is not None for v in changed) or args.grad_ckpt:
        return []
    try:
        store = open_store(args, create=False)
    except UsageError:  # a --db or $FTUI_DB that does not exist: no plans
        return []
    return decisions.for_recipe(store, recipe, inp.shape, runs_on_cpu(recipe))


def _add_switches(args: argparse.Namespace, report: dict[str, Any], recipe: Recipe | None,
                  inp: E.EstimateInput) -> None:
    """``every_switch``: each efficiency switch turned to its other states, what that does to the estimate and
    whether it runs here; ``proposals``: the switch the recommendation proposes, with its number and source
    (:mod:`runner.service.switch_report`). A recipe's only: without one there is no host check to make."""
    if recipe is None:
        report["every_switch"], report["proposals"] = [], []
        return
    rows = switch_report.switch_rows(recipe, inp)
    report["every_switch"] = [r.json() for r in rows]
    proposals = [p for p in [switch_report.memory_proposal(rows, inp)] if p]
    try:
        store = open_store(args, create=False)
    except UsageError:  # a --db or $FTUI_DB that does not exist: nothing measured
        store = None
    if store is not None:
        proposals += switch_report.speed_proposals(store, recipe, inp.shape, rows)
    report["proposals"] = proposals


def _add_track_record(args: argparse.Namespace, report: dict[str, Any], inp: E.EstimateInput) -> None:
    """Each strategy's ``track_record``: this host's own estimate error over its runs in the store
    (:mod:`runner.analysis.track_record`), None where no run of that family and strategy measured a peak here;
    every record None when there is no store to read."""
    try:
        records = host_track_record(open_store(args, create=False))
    except UsageError:  # a --db or $FTUI_DB that does not exist: no runs, so no record
        records = {}
    for name, entry in report["strategies"].items():
        record = records.get(key_of(inp, name))
        entry["track_record"] = None if record is None else record.json()


def _model_input(args: argparse.Namespace, notes: list[str]) -> tuple[E.EstimateInput, Recipe | None]:
    """The estimate's input from ``--params``, ``--model`` or the recipe (with its flags), and the recipe
    (None without one); what it assumed goes to ``notes``."""
    recipe = None
    if args.params is not None:
        try:
            shape = E.shape_from_params(args.params, layers=args.layers, hidden=args.hidden, heads=args.heads,
                                        kv_heads=args.kv_heads, intermediate=args.intermediate, vocab=args.vocab)
        except ValueError as exc:
            return fail(f"--params: {exc}")
        notes.append(f"model: {args.params:.3g} parameters, Llama-like shape ({shape.layers} layers, hidden "
                     f"{shape.hidden}, {shape.heads} heads, {shape.kv_heads} kv heads, intermediate "
                     f"{shape.intermediate}, vocabulary {shape.vocab}; sizes not given are approximate)")
        inp = E.EstimateInput(shape, method=args.method or "full", precision=args.precision or "bf16",
                              lora_r=args.lora_r or 8)
    elif args.model is not None:
        try:
            source = E.resolve_model_shape(args.model)
        except ValueError as exc:
            return fail(f"--model: {exc}")
        notes.append(f"model: {source.note}")
        inp = E.EstimateInput(source.shape, method=args.method or "full", precision=args.precision or "bf16",
                              lora_r=args.lora_r or 8)
    else:
        try:
            recipe = load_recipe(args.recipe, args.overrides)
            source = E.resolve_model_shape(recipe.model.name)
        except (RecipeError, ValueError, OSError) as exc:
            return fail(str(exc) if str(exc).startswith(str(args.recipe)) else f"{args.recipe}: {exc}")
        notes.append(f"model: {source.note}")
        inp = E.inputs_from_recipe(recipe, shape=source.shape)
        if args.method and args.method != inp.method:
            inp = replace(inp, method=args.method, param_dtype=E.recipe_param_dtype(
                recipe.model.dtype, args.method, args.precision or inp.precision))
        if args.precision:
            inp = replace(inp, precision=args.precision, param_dtype=E.recipe_param_dtype(
                recipe.model.dtype, inp.method, args.precision))
        if args.lora_r is not None:
            inp = replace(inp, lora_r=args.lora_r)
    return inp, recipe


def _approximate_note(shape: E.ModelShape) -> str | None:
    """The warning an estimate of a model the formulas do not model carries (never silently Llama)."""
    return f"APPROXIMATE: {shape.approximate}" if shape.approximate else None


def _print_text(report: dict[str, Any], inp: E.EstimateInput, gpu_mem: int, n_gpus: int, notes: list[str]) -> None:
    con = Console(highlight=False)  # the terminal's width (COLUMNS): the table fits it
    title = (f"ESTIMATED memory per device · {inp.method} · {inp.precision} · micro-batch {inp.micro_batch} × "
             f"{inp.seq_len} tokens{' · grad ckpt' if inp.gradient_checkpointing else ''} · {n_gpus} GPU(s) of "
             f"{fmt_bytes(gpu_mem)}{'' if inp.attention == 'sdpa' else f' · {inp.attention}'}"
             f"{' · compiled' if inp.compiled else ''}")
    con.print(estimate_table(report, tuple(E.PARTS), title, width=con.width))
    for note in notes:  # model names and paths are user text: never markup
        con.print(Text(note, style="bold yellow" if note.startswith("APPROXIMATE") else "dim"))
    reasons: dict[str, list[str]] = {}  # a strategy's own bound (DeepSpeed ZeRO-3), or the kernels', beside the shape's
    for name, row in report["strategies"].items():
        reason = row["per_device_bytes"].get("approximate")
        if reason and reason != inp.shape.approximate:
            reasons.setdefault(reason, []).append(name)
    for reason, names in reasons.items():
        who = "APPROXIMATE" if len(names) == len(report["strategies"]) > 1 else ", ".join(names)
        con.print(Text(f"{who}: {reason}", style="bold yellow"))
    for line in report.get("switches", []):  # context parallel, fp8, activation and NVMe offload: one line each
        con.print(Text(line))
    if report.get("every_switch"):
        con.print(Text(f"every switch of the recipe ({inp.strategy}, {inp.n_devices} process"
                       f"{'es' if inp.n_devices != 1 else ''}), turned (estimated memory; whether it runs here):",
                       style="bold"))
        for row in report["every_switch"]:
            con.print(_hanging(row["line"], con.width), style="" if row["runs_here"] else "dim")
    con.print(Text.assemble(("recommendation (estimated):", "bold"), f" {report['recommendation']['reason']}"))
    for line in report.get("proposals", []):
        con.print(_hanging(f"proposed: {line}", con.width), style="bold")
    if (term := report.get("library")) is not None:  # its own line: never inside the tensor total above
        con.print(Text(library_line(term), style="bold" if "bytes" in term else "dim"))
    for past in report.get("measured_here", []):  # ftui plan's decisions for this recipe on this host
        con.print(Text(past["line"], style="bold"))


def _hanging(line: str, width: int) -> Text:
    """``line`` indented two columns, its continuation lines four, wrapped at ``width`` (a list that stays
    readable at 80 columns)."""
    return Text(textwrap.fill(line, width=max(width, 40), initial_indent="  ", subsequent_indent="    ",
                              break_on_hyphens=False))


def _probe(args: argparse.Namespace) -> int:
    if args.recipe is None:
        return fail("estimate --probe: needs a recipe file")
    try:
        recipe = load_recipe(args.recipe, args.overrides)
        preflight(recipe)
    except RecipeError as exc:
        return fail(f"{args.recipe}: {exc}")
    return run_finder(args, recipe, args.mem_cap, str(args.recipe))


def run_finder(args: argparse.Namespace, recipe: Recipe, mem_cap: str | None, source: str) -> int:
    """The batch-size finder for ``ftui run --find-batch-size`` and ``ftui estimate --probe``."""
    con = Console(highlight=False, stderr=getattr(args, "format", "text") == "json")
    if mem_cap:
        try:
            cap = parse_bytes(mem_cap)
        except ValueError as exc:
            return fail(f"--mem-cap: {exc}")
        origin = "--mem-cap"
    elif recipe.launch.mem_cap:
        cap = parse_bytes(recipe.launch.mem_cap)  # validated with the recipe
        origin = "recipe (launch.mem_cap)"
    elif not runs_on_cpu(recipe) and _nvml_gpus():
        cap = min(_nvml_gpus())
        origin = "NVML (GPU memory)"
    else:
        return fail("find batch size: on CPU give the memory budget per rank with --mem-cap or "
                     "launch.mem_cap in the recipe, e.g. 3GiB")
    store = open_store(args, create=True)
    con.print(f"finding the micro-batch for {recipe.launch.strategy} × {recipe.launch.nproc} within "
              f"{fmt_bytes(cap)} per rank ({origin}); short real runs of 2 steps, at most 6")

    def show(t: BatchTrial) -> None:
        verdict = "fits" if t.fits else ("over the cap" if t.status == "completed" else f"failed: {t.error}")
        con.print(f"  batch {t.batch_size:>3}: run {t.run_id}, measured {fmt_bytes(t.measured_bytes)} per rank"
                  f" → {verdict}", markup=False)

    result = find_batch_size(store, recipe, cap, source=source, on_trial=show)
    if getattr(args, "format", "text") == "json":
        print(json.dumps(result, indent=2))
    else:
        table = Table(title=f"batch-size finder · sweep {result['sweep_id']}",
                      caption="measured: CUDA peak allocated on GPU; on CPU params+grads+optimizer+activations "
                      "(tensor bytes) of the busiest rank")
        for col in ("micro-batch", "run", "status", "measured per rank", "fits"):
            table.add_column(col, justify="right")
        for t in result["trials"]:
            table.add_row(str(t["batch_size"]), str(t["run_id"]), t["status"], fmt_bytes(t["measured_bytes"]),
                          "yes" if t["fits"] else "no")
        con.print(table)
    if result["chosen"] is None:
        con.print("[red]no micro-batch fits[/] (even 1 missed the budget)")
        return 1
    con.print(f"[bold]chosen micro-batch: {result['chosen']}[/] (measured) — run with "
              f"--set train.batch_size={result['chosen']}")
    return 0
