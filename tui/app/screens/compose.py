"""The Compose screen: a form over the recipe schema, validated as you type by the recipe's own
validator (``parse_recipe`` with ``--set``-style overrides), beside the exact launch command and the
memory estimate."""

from __future__ import annotations

import json
import os
import re
import shlex
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Button, Checkbox, Footer, Header, Input, Label, Select, Static
from textual.worker import get_current_worker

from runner import planner as E
from runner.service import decisions, launch, plan
from runner.service.plan_record import PlanCommand
from runner.spec import strategies
from runner.spec.launch import build_launch
from runner.spec.recipe import LaunchSection, Recipe, RecipeError, TrainSection, parse_recipe
from runner.spec.recipe_edit import changed_fields, edited_text, moved_paths
from runner.watch.host import nproc_over_host, runs_on_cpu
from runner.watch.preflight import check_files
from store import Store
from tui.app import plans
from tui.app.messages import EstimateReady, LaunchFailed, OpenPlan, PlanPrepared, PreviewReady, RunLaunched
from tui.app.screens.compose_switches import switches_text
from tui.app.screens.modals import ConfirmScreen, PickFileScreen, PromptScreen
from tui.render.report import fmt_bytes

if TYPE_CHECKING:
    from tui.app.app import FtuiApp

PLACEHOLDER_RUN_DIR = Path("<run-dir>")
ESTIMATE_DEBOUNCE_S = 0.25
"""The estimate waits this long after the last keystroke (typing does not queue estimates)."""


@dataclass(frozen=True)
class Field:
    path: str
    label: str
    kind: str  # str, opt (text; empty leaves the recipe's value), num, list, ints, choice, bool
    choices: tuple[str, ...] = ()


def choices(section: type[Any], name: str) -> tuple[str, ...]:
    """A recipe field's allowed values, read from its ``Literal`` (the recipe decides them, not the form)."""
    return tuple(str(v) for v in get_args(section.model_fields[name].annotation))


FIELDS = (
    Field("name", "run name", "str"),
    Field("model.name", "model", "str"),
    Field("data.source", "data source", "str"),
    Field("data.context_length", "context length", "num"),
    Field("method.type", "method", "choice", ("full", "lora", "qlora")),
    Field("method.lora.r", "LoRA r", "num"),
    Field("method.lora.alpha", "LoRA alpha", "num"),
    Field("method.lora.dropout", "LoRA dropout", "num"),
    Field("method.lora.target_modules", "LoRA targets", "list"),
    Field("train.batch_size", "batch size", "num"),
    Field("train.grad_accum", "grad accum", "num"),
    Field("train.lr", "learning rate", "num"),
    Field("train.max_steps", "max steps", "num"),
    Field("train.precision", "precision", "choice", choices(TrainSection, "precision")),
    Field("train.gradient_checkpointing", "grad checkpoint", "bool", ("false", "true")),
    Field("train.activation_offload", "activation offload", "bool", ("false", "true")),
    Field("launch.strategy", "strategy", "choice", strategies.names(launchable=True)),
    Field("launch.nproc", "processes", "num"),
    Field("launch.gpus", "GPUs (e.g. 0,1)", "ints"),
    Field("launch.device", "device", "choice", ("auto", "cpu", "cuda")),
    Field("launch.cp_size", "context parallel", "num"),
    Field("launch.offload", "offload", "choice", choices(LaunchSection, "offload")),
    Field("launch.nvme_path", "NVMe folder", "opt"),
)


def field_id(path: str) -> str:
    return "f-" + path.replace(".", "-")


def value_of(recipe: Recipe, path: str) -> Any:
    node: Any = recipe
    for part in path.split("."):
        node = getattr(node, part)
    return node


def display(value: Any, kind: str) -> str:
    if value is None:
        return ""
    if kind == "bool":
        return "true" if value else "false"
    if kind in ("list", "ints"):
        return ",".join(map(str, value))
    return str(value)


def override(field: Field, text: str) -> str | None:
    """The ``--set`` override for a field's text (None: leave the recipe's value)."""
    text = text.strip()
    if field.kind == "bool":  # a TOML boolean: the validator refuses the string "true"
        return f"{field.path}={text}"
    if field.kind == "num":
        return f"{field.path}={text}" if text else None
    if field.kind == "list":
        items = [json.dumps(t.strip()) for t in text.split(",") if t.strip()]
        return f"{field.path}=[{', '.join(items)}]"
    if field.kind == "ints":
        if not text:
            return None
        return f"{field.path}=[{', '.join(t.strip() for t in text.split(','))}]"
    if field.kind == "opt" and not text:
        return None
    return f"{field.path}={json.dumps(text)}"


def estimate_text(recipe: Recipe, probe: Any, store: Store | None = None) -> Text:
    """Memory per device under each strategy and the recommended one, as ``ftui estimate`` computes
    them (``runner.planner``; the model's shape from its config, never from the network), and what
    ``ftui plan`` measured for the recipe on this host (``store``'s plans). Blocking (config files, NVML,
    the store): call from a worker."""
    try:
        source = E.resolve_model_shape(recipe.model.name, allow_network=False)
        inp = E.inputs_from_recipe(recipe, shape=source.shape)
    except ValueError as exc:
        return Text(f"memory estimate: none ({exc}; ftui estimate may ask the hub)", style="dim")
    try:
        gpus = [int(g.mem_total) for g in (probe.nvml.gpu_infos() if probe is not None else []) if g.mem_total]
    except Exception:  # noqa: BLE001 (NVML trouble: estimate for a nominal GPU)
        gpus = []
    gpu_mem = min(gpus) if gpus else 80 * 2**30
    n = len(gpus) or recipe.launch.nproc
    where = f"{len(gpus)} GPU(s) of {fmt_bytes(gpu_mem)} (NVML)" if gpus else f"no GPU here: {n} nominal 80 GiB GPU(s)"
    report = E.estimate_report(inp, gpu_mem, n, strategies.names())
    rec = report["recommendation"]
    out = Text.assemble(("memory per device (estimated, runner.planner)", "bold"), f" for {where}\n",
                        (f"model: {source.note}\n", "dim"))
    for name, entry in report["strategies"].items():
        mark = "✓" if entry["fits"] else "✗"
        star = " ★" if name == rec["strategy"] else ""
        mine = " (recipe)" if name == recipe.launch.strategy else ""
        out.append(f"  {mark} {name:<6} {fmt_bytes(entry['per_device_bytes']['total']):>10}{star}{mine}\n",
                   style="bold" if star else "")
    out.append(f"★ recommended: {rec['strategy'] or 'none'}: {rec['reason']}")
    out.append_text(switches_text(recipe, inp, store))
    if store is not None:
        for past in decisions.for_recipe(store, recipe, source.shape, runs_on_cpu(recipe)):
            out.append(f"\n{past.line()}", style="bold")
    return out


def recipe_files(root: Path) -> list[str]:
    """The TOML files under ``root/recipes``, as paths relative to ``root`` (what ctrl+o offers)."""
    return sorted(str(p.relative_to(root)) for p in (root / "recipes").rglob("*.toml") if p.is_file())


def split_error(exc: RecipeError) -> tuple[str, str]:
    """``(field.path, problem)`` of a RecipeError (its attributes); ``("recipe", line)`` when the
    problem names no field."""
    return (exc.field, exc.problem) if exc.field else ("recipe", str(exc))


FORCE_HINT = "turn on force to start them anyway"
"""How Compose goes on past the process-count guard (the command line's is ``--force``)."""


def launch_problem(recipe: Recipe, force: bool = False) -> tuple[str, str] | None:
    """``(field.path, problem)`` of what the pre-flight would refuse in a recipe that validates, where it
    can be known cheaply on every keystroke: more processes than this host has devices for (unless
    ``force``: ``runner.watch.host.nproc_over_host``), a missing data file, model folder or accelerate
    config (``runner.watch.preflight.check_files``). None: nothing to say."""
    over = None if force else nproc_over_host(recipe)
    if over:
        return "launch.nproc", f"{over.split(': ', 1)[1]}; {FORCE_HINT}"
    try:
        check_files(recipe)
    except RecipeError as exc:
        return split_error(exc)
    return None


def _parses(base_text: str, item: str, base_dir: Path) -> bool:
    try:
        parse_recipe(base_text, source="form", overrides=[item], base_dir=base_dir)
    except RecipeError:
        return False
    return True


class ComposeScreen(Screen[None]):
    """Build a recipe, see its launch and estimate, save it or launch it."""

    BINDINGS = [
        Binding("ctrl+l", "launch", "Launch", priority=True),
        Binding("ctrl+s", "save", "Save", priority=True, tooltip="save the recipe as TOML: the fields that "
                "differ from the loaded file, its comments kept"),
        Binding("ctrl+o", "pick", "Open", priority=True, tooltip="open a recipe file (those under ./recipes)"),
        Binding("ctrl+r", "plan", "Plan", priority=True, tooltip="race this recipe's strategies on this host "
                "(ftui plan, in the background; asks first) and open its Plan view"),
    ]
    HELP_ROWS = [("enter (file name)", "load the file named in the top field")]

    recipe_path: reactive[str] = reactive("recipes/quickstart.toml")
    """The recipe file the form was loaded from (Save proposes a new file, never this one silently)."""
    valid: reactive[bool] = reactive(True)
    """Whether the whole form validates."""

    def __init__(self, recipe_path: str | None = None) -> None:
        super().__init__()
        self.base_text = ""
        self.base_dir = Path.cwd()
        """Relative paths of base_text are taken from here (the loaded file's folder)."""
        self.recipe: Recipe | None = None
        self.base_recipe: Recipe | None = None
        """The loaded file's recipe: Save writes the fields that differ from it into that file's text."""
        self.errors: dict[str, str] = {}
        self.shown: dict[str, tuple[str, str, list[Any]]] = {}
        """What each of the form's text widgets shows, by id: :meth:`show` skips a widget whose text is the
        same (a Static's update lays the screen out again: every keystroke would do it 20 times)."""
        self.preview_generation = 0
        """Counts the form's states that asked for a launch preview (an older one arriving late is dropped)."""
        if recipe_path:
            self.set_reactive(ComposeScreen.recipe_path, recipe_path)

    @property
    def ftui(self) -> FtuiApp:
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="compose"):
            with VerticalScroll(id="form"):
                # Compact widgets (one row each, no border): at 80x24 the form shows a dozen fields, not 4.
                with Horizontal(classes="file-row"):
                    yield Input(self.recipe_path, id="recipe-path", placeholder="recipe file", compact=True)
                    yield Button("Load", id="load", compact=True)
                    yield Button("Save", id="save", compact=True)
                for f in FIELDS:
                    with Horizontal(classes="field"):
                        yield Label(f.label, classes="field-label")
                        if f.kind in ("choice", "bool"):
                            yield Select([(c, c) for c in f.choices], id=field_id(f.path), allow_blank=False,
                                         compact=True)
                        else:
                            yield Input(id=field_id(f.path), compact=True)
                        yield Static("", id="err-" + field_id(f.path), classes="field-error")
                yield Checkbox("force: start more processes than this host has devices for", id="force",
                               compact=True)
                yield Button("Launch (ctrl+l)", id="launch", variant="success", compact=True)
            with VerticalScroll(id="side"):
                yield Static("", id="form-status")
                yield Static("", id="preview")
                yield Static("", id="estimate")
        yield Footer()

    def on_mount(self) -> None:
        self.load(self.recipe_path)

    # ------------------------------------------------------------------ loading and validating

    def load(self, path: str) -> None:
        try:
            text = Path(path).expanduser().read_text()
            base_dir = Path(path).expanduser().parent
            recipe = parse_recipe(text, source=path, base_dir=base_dir)
        except (OSError, RecipeError) as exc:
            self.notify(str(exc), severity="error", markup=False)
            return
        self.base_text = text
        self.base_dir = base_dir
        self.base_recipe = recipe
        self.recipe_path = path
        with self.prevent(Input.Changed, Select.Changed):
            for f in FIELDS:
                value = value_of(recipe, f.path)
                if f.kind in ("choice", "bool"):
                    self.query_one("#" + field_id(f.path), Select).value = display(value, f.kind)
                else:
                    widget = self.query_one("#" + field_id(f.path), Input)
                    widget.value = display(value, f.kind)
                    widget.placeholder = f"empty: the recipe's {display(value, f.kind) or 'default'}"
        self.validate()

    def focus_field(self, path: str) -> None:
        """Focus a field's widget (the palette's "Go to field"), cursor at the end of its text."""
        widget = self.query_one("#" + field_id(path))
        widget.focus()
        if isinstance(widget, Input):
            # After the Focus event: focus() sets the focus from the app's queue, which then posts Focus
            # to the Input, which selects all its text; a key typed then would replace the value.
            self.app.call_later(widget.call_later, widget.action_end)

    def field_text(self, f: Field) -> str:
        widget = self.query_one("#" + field_id(f.path))
        if isinstance(widget, Select):
            return str(widget.value)
        assert isinstance(widget, Input)
        return widget.value

    def overrides(self) -> list[str]:
        return [o for f in FIELDS if (o := override(f, self.field_text(f))) is not None]

    def validate(self) -> Recipe | None:
        """Validate the WHOLE form as one recipe (every field's value together: a strategy and its
        process count are checked as a pair); show each error next to its field.

        The validator stops at the first problem, so a field in error is set back to the loaded
        file's value and the form is validated again, until it passes or no new field is named:
        every field in error gets its own message, not only the first."""
        self.errors = {}
        paths = {f.path for f in FIELDS}
        active = {f.path: o for f in FIELDS if (o := override(f, self.field_text(f))) is not None}
        other = ""
        recipe: Recipe | None = None
        for _ in range(len(FIELDS) + 1):
            try:
                recipe = parse_recipe(self.base_text, source="form", overrides=list(active.values()),
                                      base_dir=self.base_dir)
                break
            except RecipeError as exc:
                path, msg = split_error(exc)
                if path not in paths:
                    # No field named (an override that does not parse): find the field whose value alone fails.
                    path = next((p for p, o in active.items() if not _parses(self.base_text, o, self.base_dir)), path)
                if path not in paths or path in self.errors:
                    other = "" if path in self.errors else f"{path}: {msg}"
                    break
                self.errors[path] = msg
                active.pop(path, None)
        if recipe is not None:
            # What parses may still be refused by the pre-flight (files, process count): named here, not at launch.
            problem = launch_problem(recipe, self.force)
            if problem is not None and problem[0] in paths:
                self.errors[problem[0]] = problem[1]
            elif problem is not None:
                other = f"{problem[0]}: {problem[1]}"
        if self.errors or other:
            recipe = None
        whole_error = other or next((f"{p}: {m}" for p, m in self.errors.items()), "")
        for f in FIELDS:
            self.show("err-" + field_id(f.path), Text(self.errors.get(f.path, ""), style="red"))
            self.query_one("#" + field_id(f.path)).set_class(f.path in self.errors, "-invalid")
        self.recipe = recipe
        self.valid = recipe is not None
        if recipe is None:
            self.show("form-status", Text(f"✗ {whole_error or 'fix the fields marked in red'}", style="red"))
        else:
            self.show("form-status", Text("✓ valid recipe (its validator and the pre-flight's file and process "
                                          f"checks) · {self.recipe_path}", style="green"))
        self.show_preview(recipe)
        return recipe

    def show(self, widget_id: str, text: Text | str) -> None:
        """Put ``text`` in the Static ``widget_id`` unless it shows that already."""
        rich = text if isinstance(text, Text) else Text(text)
        key = (rich.plain, str(rich.style), list(rich.spans))  # Text's own == ignores its style
        if self.shown.get(widget_id) == key:
            return
        self.shown[widget_id] = key
        self.query_one("#" + widget_id, Static).update(text)

    def show_preview(self, recipe: Recipe | None) -> None:
        if recipe is None:
            # The last valid command would mislead: say what the preview waits for.
            wait = Text("launch command and memory estimate: waiting for the fields in red to be fixed",
                        style="dim italic")
            self.preview_generation += 1  # a preview still being built is for an older form
            self.show("preview", wait)
            self.show("estimate", "")
            self.estimate_memory(None)
            return
        # Building the launch (accelerate's config, the env) costs ~15 ms a keystroke on a loaded machine:
        # a thread worker builds it, so that typing never waits on it; the form's verdict stays immediate.
        self.preview_generation += 1
        self.build_preview(recipe, self.preview_generation)
        self.estimate_memory(recipe)

    @work(thread=True, exclusive=True, group="preview")
    def build_preview(self, recipe: Recipe, generation: int) -> None:
        spec = build_launch(recipe, PLACEHOLDER_RUN_DIR, port=29500, cpu_threads=self.ftui.cpu_threads(recipe),
                            python=self.ftui.python, environ=os.environ)
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in spec.env.items())
        self.post_message(PreviewReady(Text.assemble(("launch command", "bold"),
                                                     " (run folder and port are set at launch)\n",
                                                     f"{env} {shlex.join(spec.argv)}"), generation))

    def on_preview_ready(self, message: PreviewReady) -> None:
        if self.valid and message.generation == self.preview_generation:  # not a form that changed since
            self.show("preview", message.text)

    @work(thread=True, exclusive=True, group="estimate")
    def estimate_memory(self, recipe: Recipe | None) -> None:
        """Estimate in a thread (the model's config may be read from disk, NVML is asked for the GPUs);
        exclusive and debounced, so that only the form's latest state is estimated."""
        worker = get_current_worker()
        if recipe is None:
            return
        time.sleep(ESTIMATE_DEBOUNCE_S)
        if worker.is_cancelled:
            return
        text = estimate_text(recipe, self.ftui.probe, self.ftui.store)
        if not worker.is_cancelled:
            self.post_message(EstimateReady(text))

    def on_launch_failed(self, message: LaunchFailed) -> None:
        """A pre-flight refusal (or a failed start) also stays on the form, not only in a toast;
        the message goes on to the app, which notifies."""
        self.show("form-status", Text(f"✗ not launched: {message.error}", style="red"))

    def on_estimate_ready(self, message: EstimateReady) -> None:
        if self.valid:
            self.show("estimate", message.text)

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id and event.input.id.startswith("f-"):
            self.validate()

    def on_select_changed(self, event: Select.Changed) -> None:
        self.validate()

    def on_checkbox_changed(self, event: Checkbox.Changed) -> None:
        self.validate()

    @property
    def force(self) -> bool:
        """The force toggle: launch more processes than this host has devices for (``--force``)."""
        return self.query_one("#force", Checkbox).value

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "recipe-path":
            self.action_load()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        {"load": self.action_load, "save": self.action_save, "launch": self.action_launch}[event.button.id or "launch"]()

    # ------------------------------------------------------------------ actions

    def action_load(self) -> None:
        self.load(self.query_one("#recipe-path", Input).value)

    def action_pick(self) -> None:
        """ctrl+o: pick a recipe file under ./recipes; it is loaded and the first field focused (typed
        letters then edit the form, never the app's keys)."""
        def picked(path: str | None) -> None:
            if path:
                self.query_one("#recipe-path", Input).value = path
                self.load(path)
                self.focus_field(FIELDS[0].path)

        self.app.push_screen(PickFileScreen("Open a recipe (enter opens, escape cancels)", recipe_files(Path.cwd()),
                                            "No recipe file under ./recipes: type a path in the top field "
                                            "and press enter (escape closes)"), picked)

    def save_target(self, recipe: Recipe) -> str:
        """Where Save proposes to write: ``recipes/<name>.toml`` under the current folder, never the
        loaded file itself (a shipped recipe keeps its comments): ``<name>-2.toml``… when it is taken."""
        loaded = Path(self.recipe_path).expanduser().resolve()
        folder = Path("recipes")
        stem = re.sub(r"[^\w.-]+", "-", recipe.name).strip(".-") or "recipe"
        for n in range(1, 1000):
            candidate = folder / (f"{stem}.toml" if n == 1 else f"{stem}-{n}.toml")
            if candidate.resolve() != loaded and not candidate.exists():
                return str(candidate)
        return str(folder / f"{stem}-new.toml")

    def action_save(self) -> None:
        """Ask where to save (a new file by default); ask again before overwriting any file."""
        recipe = self.validate()
        if recipe is None:
            self.notify("not saved: the recipe does not validate", severity="error")
            return

        def chosen(answer: str | None) -> None:
            if not answer or not answer.strip():
                return
            path = Path(answer.strip()).expanduser()
            if path.exists():
                same = path.resolve() == Path(self.recipe_path).expanduser().resolve()
                question = (f"Overwrite {path}? " + ("It is the file the form was loaded from: the changed "
                            "fields are written into it, its comments kept." if same else "Its contents are replaced."))

                def confirmed(yes: bool | None) -> None:
                    if yes:
                        self.write_recipe(recipe, path)

                self.app.push_screen(ConfirmScreen(question), confirmed)
            else:
                self.write_recipe(recipe, path)

        self.app.push_screen(PromptScreen("Save the recipe as (a new file; enter saves, escape cancels)",
                                          self.save_target(recipe)), chosen)

    def recipe_text(self, recipe: Recipe, path: Path) -> str:
        """The TOML Save writes to ``path``: the loaded file's text with only the fields that differ set,
        its comments kept; its relative paths made absolute when ``path`` is in another folder."""
        base = self.base_recipe or parse_recipe(self.base_text, source="form", base_dir=self.base_dir)
        changes = moved_paths(self.base_text, base, self.base_dir, path.parent)
        changes.update(changed_fields(base, recipe, [f.path for f in FIELDS]))
        return edited_text(self.base_text, changes)

    def write_recipe(self, recipe: Recipe, path: Path) -> None:
        try:
            text = self.recipe_text(recipe, path)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        except OSError as exc:
            self.notify(f"{path}: {exc.strerror}", severity="error", markup=False)
            return
        self.notify(f"saved {path}", markup=False)

    def action_launch(self) -> None:
        recipe = self.validate()
        if recipe is None:
            self.notify("not launched: the recipe does not validate", severity="error")
            return
        self.notify(f"launching {recipe.name} ({recipe.launch.strategy} × {recipe.launch.nproc})…", markup=False)
        self.launch(recipe, self.recipe_path, self.force)

    def plan_command(self, recipe: Recipe) -> PlanCommand:
        """``ftui plan`` of the form: the loaded file with the fields changed on the form (:func:`plans.command_of`)."""
        base = self.base_recipe
        changed = [mine for f in FIELDS if (mine := override(f, self.field_text(f))) is not None
                   and (base is None or mine != override(f, display(value_of(base, f.path), f.kind)))]
        return plans.command_of(self.recipe_path, changed, recipe)

    def action_plan(self) -> None:
        """ctrl+r: the plan of the form's recipe, checked as ``ftui plan`` checks it; its view opens (after
        asking how many trials per candidate, unless it is racing already)."""
        recipe = self.validate()
        if recipe is None:
            self.notify("no plan: the recipe does not validate", severity="error")
            return
        self.notify(f"plan of {recipe.name}: checking its candidates…", markup=False)
        self.prepare_plan(self.plan_command(recipe))

    @work(thread=True, group="launch")
    def prepare_plan(self, command: PlanCommand) -> None:
        try:
            self.post_message(plans.prepare(command))
        except (RecipeError, plan.PlanError) as exc:
            self.post_message(LaunchFailed(f"plan: {exc}"))

    def on_plan_prepared(self, message: PlanPrepared) -> None:
        if message.racing:
            self.notify(f"plan {message.pid} is racing already: its view opens", markup=False)
            self.post_message(OpenPlan(message.pid))
            return

        def chosen(answer: str | None) -> None:
            if answer is None or not answer.strip():
                return
            repeat = int(answer) if answer.strip().isdigit() else 0
            if repeat < 1:
                self.notify(f"--repeat: a whole number, 1 or more; got {answer.strip()!r}", severity="error",
                            markup=False)
                return
            self.start_plan(replace(message.command, repeat=repeat), message.pid)

        self.app.push_screen(PromptScreen(plans.race_question(message), str(message.command.repeat)), chosen)

    @work(thread=True, group="launch")
    def start_plan(self, command: PlanCommand, pid: str) -> None:
        try:
            process = plans.start_plan(command, self.ftui.store.url, pid)
        except OSError as exc:
            self.post_message(LaunchFailed(f"plan: not started: {exc}"))
            return
        self.post_message(OpenPlan(pid, process))

    @work(thread=True, group="launch")
    def launch(self, recipe: Recipe, source: str, force: bool) -> None:
        try:
            launched = launch.launch_detached(self.ftui.store, launch.LaunchRequest(recipe, source), self.ftui.fake_gpus,
                                              force=force)
        except (RecipeError, OSError) as exc:
            self.post_message(LaunchFailed(str(exc)))
            return
        self.post_message(RunLaunched(launched.run_id, launched.warnings))
