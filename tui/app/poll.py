"""Reading the store for the screens, in worker threads.

The store is the only source: a run may belong to another process or machine, and re-attaching
after a restart is just reading the store again. The monitor feed reads incrementally (rows newer
than the last it saw) so that an 8-GPU run sampled at 2 Hz stays cheap to watch.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from runner.hardware.records import SOURCE_LABELS
from runner.spec.events import phase_words
from store import RunInfo, Store
from store.nodes import nodes, samples_per_node
from store.rollup import downsample_points
from store.store import utcnow
from tui.app.messages import DeviceView, MonitorSnapshot, RankView

HISTORY = 40
"""Samples of history kept per device for the sparklines."""
SERIES = ("loss", "lr", "grad_norm", "tokens_per_s")
"""The per-step curves the monitor draws (``MetricPoint`` fields)."""
LONG_RUN_STEPS = 2000
"""A run with more logged steps than this opens from the store's curve summaries, not every row."""
SERIES_CAP_PER_WIDTH = 8
"""Points kept per curve, per column of plot width, before the feed thins its own history."""
RECENT_KEPT = 64
"""Raw steps kept for the latest figures (ETA over the last 10, tokens/s, lr)."""


Clock = Callable[[], datetime]
REST_SLICE_S = 0.05
"""How soon a resting feed worker notices that it was cancelled (a screen closed, the app quit)."""


def rest(cancelled: Callable[[], bool], seconds: float) -> bool:
    """Waits ``seconds`` between two reads of a feed worker, in slices, so that a cancel ends the wait within
    ``REST_SLICE_S`` whatever the interval; True when the worker was cancelled."""
    deadline = time.monotonic() + seconds
    while not cancelled():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(REST_SLICE_S, left))
    return True


def downsample(values: list[float], width: int) -> list[float]:
    """Bucket means so that at most ``width`` points remain (the data itself is kept)."""
    if width <= 0 or len(values) <= width:
        return list(values)
    size = len(values) / width
    out = []
    for i in range(width):
        chunk = values[int(i * size): max(int((i + 1) * size), int(i * size) + 1)]
        out.append(sum(chunk) / len(chunk))
    return out


def tail_lines(path: Path, n: int, max_bytes: int = 4096) -> list[str]:
    try:
        with path.open("rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            data = fh.read().decode("utf-8", "replace")
    except OSError:
        return []
    lines = [line.rstrip() for line in data.splitlines() if line.strip()]
    return lines[-n:]


class MonitorFeed:
    """Everything the monitor shows about one run, updated from the store by :meth:`poll`.

    Used by one worker thread at a time; the snapshots it returns are new objects.
    """

    def __init__(self, store: Store, run_id: int, log_lines: int = 8, plot_width: int = 200,
                 now: Clock = utcnow) -> None:
        self.store = store
        self.now = now
        self.run_id = run_id
        self.log_lines = log_lines
        self.plot_width = plot_width
        self.metrics: list[Any] = []
        """The newest logged steps, raw (step, loss, lr, tokens/s, step time, grad norm); trimmed to
        :data:`RECENT_KEPT` (the curves live in ``series``)."""
        self.series: dict[str, list[tuple[int, float]]] = {name: [] for name in SERIES}
        """Per curve, (step, value): every point of a short run; of a long one its stored summary
        (``Store.curves``) plus the steps logged since, thinned past ``SERIES_CAP_PER_WIDTH`` x width
        points keeping each bucket's first, last, lowest and highest (``store.rollup``)."""
        self.loss_steps = 0
        self._series_from: dict[str, int] = {}
        self._last_step = -1
        self._last_sample_id = 0
        self._last_proc_id = 0
        self._util: dict[str, deque[float]] = {}
        self._mem: dict[str, deque[float]] = {}
        self._latest: dict[str, Any] = {}
        self._rank_gpu: dict[int, dict[int, int]] = {}
        self.named: dict[str, list[tuple[float, float]]] = {}
        self._last_named = -1
        self._evals_unread = False
        """Named metrics were read from their summaries: read the last evaluation's samples once."""
        self.samples: list[dict[str, str]] = []
        self.samples_step: int | None = None

    def poll(self) -> MonitorSnapshot:
        run = self.store.get_run(self.run_id)
        if self._last_step == -1 and run is not None and run.resumed_from is not None:
            # A resumed run's curve starts with its parent's, up to the checkpoint (as compare shows it).
            from runner.analysis.compare import joined_metrics  # deferred: pydantic

            fresh = joined_metrics(self.store, run)
        elif self._last_step == -1 and run is not None and (run.steps_done or 0) > LONG_RUN_STEPS:
            fresh = self._load_summaries()
            self._load_named_summaries()
        else:
            fresh = self.store.metrics(self.run_id, after_step=self._last_step)
        for m in fresh:
            self.metrics.append((m.step, m.loss, m.lr, m.tokens_per_s, m.step_time, m.grad_norm))
            for name in SERIES:
                value = getattr(m, name)
                if value is not None and m.step > self._series_from.get(name, -1):
                    self.series[name].append((m.step, value))
                    self.loss_steps += name == "loss"
            self._last_step = max(self._last_step, m.step)
        if len(self.metrics) > 2 * RECENT_KEPT:
            del self.metrics[:-RECENT_KEPT]
        cap = SERIES_CAP_PER_WIDTH * max(1, self.plot_width)
        for name, points in self.series.items():
            if len(points) > cap:
                self.series[name] = downsample_points(points, cap // 2)
        fresh_named = self.store.named_metrics(self.run_id, after_step=self._last_named)
        for point in fresh_named:
            if point.value is not None:
                self.named.setdefault(point.name, []).append((float(point.step), point.value))
            self._last_named = max(self._last_named, point.step)
        for name, named_points in self.named.items():
            if len(named_points) > cap:  # as the series: every point stays stored, the view keeps the extremes
                thinned = downsample_points([(int(step), value) for step, value in named_points], cap // 2)
                self.named[name] = [(float(step), value) for step, value in thinned]
        summarised_evals = self._evals_unread and any(name.startswith("eval/") for name in self.named)
        self._evals_unread = False
        if summarised_evals or any(p.name.startswith("eval/") for p in fresh_named):
            from runner.analysis.compare import last_samples  # deferred: pydantic

            events = self.store.events(self.run_id, "eval_samples")
            if events:
                self.samples, self.samples_step = last_samples(self.store, self.run_id), events[-1].payload.get("step")
        for d in self.store.samples(self.run_id, after_id=self._last_sample_id):
            # Several machines: each node's GPUs and host are its own (ranks are numbered across the world).
            node = getattr(d, "node", None)
            key = f"{d.kind}:{d.index}" if not node or d.kind == "rank" else f"{d.kind}:{d.index}@{node}"
            mem_used = d.mem_used
            if d.kind == "rank" and not mem_used:
                # An exited rank not yet reaped reads an RSS of 0: no reading, the last real one stays.
                mem_used = self._latest[key][4] if key in self._latest else None
            self._latest[key] = (d.kind, d.index, d.name, d.util_pct, mem_used, d.mem_total, d.source, d.pid,
                                 d.temp_c, d.power_w, key, node)
            if d.util_pct is not None:
                self._util.setdefault(key, deque(maxlen=HISTORY)).append(d.util_pct)
            if mem_used is not None and d.mem_total and (mem_used or d.kind != "rank"):
                self._mem.setdefault(key, deque(maxlen=HISTORY)).append(100.0 * mem_used / d.mem_total)
            self._last_sample_id = d.id
        for p in self.store.process_samples(self.run_id, after_id=self._last_proc_id):
            if p.rank is not None and p.used_bytes is not None:
                self._rank_gpu.setdefault(p.rank, {})[p.gpu_index] = p.used_bytes
            self._last_proc_id = p.id
        return self.snapshot(run)

    @property
    def losses(self) -> list[float]:
        """The loss curve's values (every logged loss of a short run; see ``series``)."""
        return [v for _, v in self.series["loss"]]

    def _load_summaries(self) -> list[Any]:
        """A long run's curves from the store's per-block summaries (a few thousand rows, however long
        the run), then the raw steps logged after them; the newest raw steps for the figures."""
        points = SERIES_CAP_PER_WIDTH * max(1, self.plot_width) // 2
        after: int | None = None
        for name in SERIES:
            curve = self.store.curves([self.run_id], name, points)[self.run_id]
            self.series[name] = list(curve.points)
            if curve.last_step is not None:
                self._series_from[name] = curve.last_step
                after = curve.last_step if after is None else min(after, curve.last_step)
            if name == "loss":
                self.loss_steps = curve.count
        fresh = self.store.metrics(self.run_id, after_step=after)
        if len(fresh) < RECENT_KEPT:
            older = self.store.metrics(self.run_id, last=RECENT_KEPT)
            seen = {m.step for m in fresh}
            fresh = [m for m in older if m.step not in seen] + fresh
        return fresh

    def _load_named_summaries(self) -> None:
        """A long run's named metrics from their per-block summaries (``Store.named_curves``), so that the
        first poll does not read every ``eval/*`` or ``train/*`` value; values logged after them are read
        as they come."""
        points = SERIES_CAP_PER_WIDTH * max(1, self.plot_width) // 2
        for name, curve in self.store.named_curves([self.run_id], points=points)[self.run_id].items():
            self.named[name] = [(float(step), value) for step, value in curve.points]
            if curve.last_step is not None:
                self._last_named = max(self._last_named, curve.last_step)
        self._evals_unread = True

    def snapshot(self, run: Any) -> MonitorSnapshot:
        gpus = sorted((v for v in self._latest.values() if v[0] == "gpu"), key=lambda v: (v[11] or 0, v[1]))
        ranks = sorted((v for v in self._latest.values() if v[0] == "rank"), key=lambda v: v[1])
        shown = gpus or ranks
        devices = []
        hosts = [v for v in self._latest.values() if v[0] == "host"]
        for kind, index, name, util, used, total, source, _pid, temp, power, key, node in shown:
            label = f"GPU {index} {_short(name)}" if kind == "gpu" else f"rank {index} (CPU process)"
            if len(hosts) > 1 and kind == "gpu":
                label = f"node #{node or 0} {label}"
            devices.append(DeviceView(key=key, label=label, source=SOURCE_LABELS.get(source, source), util=util,
                                      mem_used=used, mem_total=total,
                                      util_history=list(self._util.get(key, ())),
                                      mem_history=list(self._mem.get(key, ())), temp_c=temp, power_w=power))
        host = None
        for _kind, _index, name, util, used, total, source, _pid, _temp, _power, key, node in sorted(
                hosts, key=lambda v: v[11] or 0):
            view = DeviceView(key="host" if host is None else key, label=name if len(hosts) == 1 else
                              f"node #{node or 0} {name}", source=SOURCE_LABELS.get(source, source), util=util,
                              mem_used=used, mem_total=total, util_history=list(self._util.get(key, ())),
                              mem_history=list(self._mem.get(key, ())))
            if host is None:
                host = view  # the first node's host in the host row; every other node's beside the devices
            else:
                devices.append(view)
        rank_rows = [
            RankView(rank=index, pid=pid, cpu_pct=util, rss=used,
                     gpu_mem=sum(self._rank_gpu[index].values()) if index in self._rank_gpu else None,
                     source=SOURCE_LABELS.get(source, source))
            for _k, index, _n, util, used, _t, source, pid, _temp, _power, _key, _node in ranks
        ]
        step = self.metrics[-1][0] if self.metrics else (run.steps_done or 0 if run else 0)
        total = run.total_steps if run else None
        recent = self.metrics[-10:]
        step_times = [m[4] for m in recent if m[4]]
        eta = None
        if total and step_times and run is not None and run.status == "running":
            eta = max(0, total - step) * sum(step_times) / len(step_times)
        tps = recent[-1][3] if recent else (run.tokens_per_s if run else None)
        curves = {label: downsample([v for _, v in self.series[name]], self.plot_width)
                  for label, name in (("lr", "lr"), ("grad norm", "grad_norm"), ("tokens/s", "tokens_per_s"))}
        elapsed = None
        if run is not None and run.started_at is not None:
            elapsed = max(0.0, ((run.ended_at or self.now()) - run.started_at).total_seconds())
        return MonitorSnapshot(
            run=run,
            loss=downsample(self.losses, self.plot_width),
            loss_steps=self.loss_steps,
            step=step,
            total=total,
            tokens_per_s=tps,
            lr=recent[-1][2] if recent else None,
            last_loss=self.losses[-1] if self.losses else (run.final_loss if run else None),
            eta_s=eta,
            devices=devices,
            ranks=rank_rows,
            log_tail=self.log_tail(run),
            curves=curves,
            grad_norm=recent[-1][5] if recent else None,
            elapsed_s=elapsed,
            phase=self.phase(run, elapsed),
            host=host,
            loss_points=list(zip(downsample([float(m[0]) for m in self.metrics if m[1] is not None], self.plot_width),
                                 downsample([m[1] for m in self.metrics if m[1] is not None], self.plot_width),
                                 strict=True)),
            named={name: list(points) for name, points in self.named.items()},
            samples=list(self.samples),
            samples_step=self.samples_step,
            extra={"nodes": self.nodes_line(run)} if run is not None and (run.nnodes or 1) > 1 else {},
        )

    def nodes_line(self, run: Any) -> str:
        """A run on several machines: each node's host, status, last report and samples, from the store."""
        counts = samples_per_node(self.store, run.id)
        parts = []
        for n in nodes(self.store, run.id):
            label = str(n.node_rank) if n.node_rank is not None else f"#{n.slot}"
            seen = f", last report {n.heartbeat_age():.0f} s ago" if n.status == "running" else ""
            parts.append(f"node {label} {n.host}: {n.status}{seen}, {counts.get(n.slot, 0):,} samples")
        return f"{len(parts)}/{run.nnodes} nodes (store) · " + " · ".join(parts)

    def phase(self, run: Any, elapsed: float | None) -> str:
        """Before the first logged step, what the run is doing: the journal's last event (the trainer
        logs no event while it loads the model and tokenizes, so the time since start says the rest)."""
        if run is None or self.metrics or run.status not in ("running", "created", "starting"):
            return ""
        events = self.store.events(self.run_id)
        trainer = [e for e in events if e.source == "trainer"]
        if trainer and trainer[-1].type == "phase":  # the trainer says what it does (runner.spec.events.PhaseEvent)
            return f"starting: {phase_words(trainer[-1].payload)} ({fmt_elapsed(elapsed)})"
        last = events[-1].type if events else "none yet"
        return f"starting: no step yet ({fmt_elapsed(elapsed)}) · last journal event: {last}"

    def log_tail(self, run: Any) -> list[str]:
        if run is None or not run.run_dir:
            return []
        logs = sorted((Path(run.run_dir) / "logs").glob("rank*.log"))
        lines: list[str] = []
        for log in logs:
            tag = log.stem.replace("rank", "r")
            lines.extend(f"[{tag}] {line}" for line in tail_lines(log, self.log_lines))
        if not lines:
            lines = [f"[launcher] {line}" for line in tail_lines(Path(run.run_dir) / "launcher.log", self.log_lines)]
        return lines[-self.log_lines:]


def settle_abandoned(store: Store, fake_gpus: int = 0) -> list[str]:
    """Recovery's rule (:func:`runner.service.recover.recover_all`) for the runs on this host whose watcher
    died while the dashboard is open: a new watcher when their ranks still run, else their true status,
    so that no run shows ``running`` (and a ticking duration) after its processes are gone. One line per
    run it changed (blocking: from a worker)."""
    from runner.service.recover import recover_all  # deferred: pydantic (recipe models): off the first paint

    done = recover_all(store, fake_gpus=fake_gpus)
    return [f"run {r.run_id}: {r.action} -> {r.status}" + (f" ({r.detail})" if r.detail else "")
            for r in done if r.action in ("finished", "attached", "error")]


def fmt_elapsed(seconds: float | None) -> str:
    if seconds is None:
        return "not started"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def run_duration(run: RunInfo, now: Clock = utcnow) -> float | None:
    """Wall time from start to end, or to ``now()`` while running (``now`` is frozen in snapshots)."""
    if run.started_at is None:
        return None
    end = run.ended_at or now()
    return float((end - run.started_at).total_seconds())


def _short(gpu_name: str) -> str:
    name = gpu_name.removeprefix("NVIDIA ").removeprefix("Tesla ")
    return name if len(name) <= 14 else name[:13] + "…"
