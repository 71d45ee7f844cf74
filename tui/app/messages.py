"""Messages shared between screens and their workers (workers post these; they never touch widgets).

High-rate messages (``RunsLoaded`` at 1 Hz, ``MonitorUpdate`` at 2 Hz) do not bubble and coalesce:
each carries a whole snapshot, so a newer one can replace an older one still in the queue.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from textual.message import Message

from store import MetricPoint, RunInfo
from store.queue import QueueEntryInfo

if TYPE_CHECKING:  # the comparison and the plans are imported with their screens, not at start
    from runner.analysis.compare import Comparison
    from runner.service.plan_record import Listing, PlanCommand, Process
    from tui.app.plans import CommitStart, PlanView


@dataclass
class RunsLoaded(Message, bubble=False):
    """The runs in the store, newest first (a whole snapshot of the newest ``limit``, or of every run)."""

    runs: list[RunInfo]
    live: dict[int, MetricPoint] = field(default_factory=dict)
    """The latest logged step of each running run (its live step, loss and tokens/s)."""
    total: int | None = None
    """How many runs the store holds, when ``runs`` is only the newest of them."""
    queue: list[QueueEntryInfo] = field(default_factory=list)
    """The queue's entries still to see to (waiting, running, not started), in line order."""

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, RunsLoaded)


@dataclass
class DeviceView:
    """One device row of the monitor: a GPU, or a rank process on CPU."""

    key: str
    label: str
    source: str
    util: float | None
    mem_used: int | None
    mem_total: int | None
    util_history: list[float] = field(default_factory=list)
    mem_history: list[float] = field(default_factory=list)
    temp_c: float | None = None
    power_w: float | None = None

    @property
    def short_label(self) -> str:
        """``GPU 0`` or ``rank 0``: the label for narrow terminals."""
        return " ".join(self.label.split()[:2])


@dataclass
class RankView:
    """One rank's process: CPU % of one core, RSS, and the GPU memory NVML attributes to it."""

    rank: int
    pid: int | None
    cpu_pct: float | None
    rss: int | None
    gpu_mem: int | None
    source: str


@dataclass
class MonitorSnapshot:
    """What the monitor shows of one run; built by the feed in a worker thread."""

    run: RunInfo | None
    loss: list[float]
    """Loss per logged step, downsampled for display (the feed keeps every point)."""
    loss_steps: int
    step: int
    total: int | None
    tokens_per_s: float | None
    lr: float | None
    last_loss: float | None
    eta_s: float | None
    devices: list[DeviceView]
    ranks: list[RankView]
    log_tail: list[str]
    extra: dict[str, Any] = field(default_factory=dict)
    curves: dict[str, list[float]] = field(default_factory=dict)
    """``lr``, ``grad norm``, ``tokens/s`` per logged step (downsampled like ``loss``)."""
    grad_norm: float | None = None
    elapsed_s: float | None = None
    """Since the run started (the app's clock while running)."""
    phase: str = ""
    """Before the first step: ``starting: no step yet (12s) · last journal event: start``."""
    host: DeviceView | None = None
    """The whole machine (CPU of all cores, memory; psutil), so that other load is visible."""
    loss_points: list[tuple[float, float]] = field(default_factory=list)
    """(step, loss), downsampled: the x axis a second curve at other steps lines up with."""
    named: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    """Named metrics (``eval/loss``, user metrics): name to (step, value)."""
    samples: list[dict[str, str]] = field(default_factory=list)
    """The last evaluation's samples (``[{"prompt", "completion"}]``)."""
    samples_step: int | None = None


@dataclass
class MonitorUpdate(Message, bubble=False):
    """A fresh snapshot of the monitored run."""

    snapshot: MonitorSnapshot

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, MonitorUpdate)


@dataclass
class RunLaunched(Message):
    """A run was prepared and started detached; open its monitor."""

    run_id: int
    warnings: list[str] = field(default_factory=list)
    """The pre-flight's warnings (busy GPUs, too little free memory, inputs), shown to the user."""


@dataclass
class LaunchFailed(Message):
    """Preparing or starting a run failed; one line for the user."""

    error: str


@dataclass
class OpenRun(Message):
    """Open the monitor of a run."""

    run_id: int


@dataclass
class CompareRuns(Message):
    """Open the comparison of these runs."""

    run_ids: list[int]


@dataclass
class CompareLoaded(Message, bubble=False):
    """The comparison of the selected runs (``runner.analysis.compare.load_comparison``), or why there is none."""

    comparison: Comparison | None
    error: str = ""


@dataclass
class EstimateReady(Message, bubble=False):
    """The memory estimate and recommendation for the recipe in the Compose form (rich text)."""

    text: Any


@dataclass
class PreviewReady(Message, bubble=False):
    """The launch command for the recipe in the Compose form, built in a thread worker."""

    text: Any
    generation: int
    """The form's validation it belongs to: an older one (the form changed since) is dropped."""


@dataclass
class Notice(Message):
    """One line for the user from a worker (the app shows it as a notification)."""

    text: str
    severity: str = "information"


@dataclass
class PlanLoaded(Message, bubble=False):
    """A fresh view of the plan on screen (``tui.app.plans.PlanFeed``)."""

    view: PlanView

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, PlanLoaded)


@dataclass
class PlansLoaded(Message, bubble=False):
    """The plans the store and this host know (``runner.service.plan_record.list_plans``), or why none."""

    plans: list[Listing]
    states: list[str]
    """Each plan's state in words (``tui.app.screens.plan.plan_state``)."""
    error: str = ""


@dataclass
class PlanCommitStarted(Message, bubble=False):
    """What the Plan view's commit key did (the line to show, the process it started)."""

    start: CommitStart


@dataclass
class PlanPrepared(Message, bubble=False):
    """Compose's plan key: the plan of the form's recipe, checked as ``ftui plan`` checks it."""

    command: PlanCommand
    pid: str
    raced: int
    """Candidates the plan races (the others are listed in its view with why not)."""
    candidates: int
    steps: int
    racing: bool
    """A process of this plan runs already: its view opens, nothing more is started."""


@dataclass
class OpenPlan(Message):
    """Open the Plan view of a plan (``started``: the process just started for it, before its record)."""

    pid: str
    started: Process | None = None
