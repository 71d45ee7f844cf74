"""Costs of the dashboard, measured headless.

    python bench/bench_tui.py [--seconds 20]

1. first paint: from spawning ``python`` to the first frame of the Runs screen that shows the store's
   runs (interpreter start, imports, the store opened and read by the screen's worker, the render), in a
   child process running what ``ftui`` runs (``tui.app.app.dashboard``), headless (Textual's run_test
   driver); also spawn to the screen's first frame, drawn before the store answers.
2. monitor: CPU of the app process (getrusage, all its threads) over ``--seconds`` while it watches a
   running 8-GPU run whose store gets 8 fake GPU samples + 8 rank samples every 0.5 s and one step
   every 0.5 s on top of a 100k-point loss history; the writer is a separate process, not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

HISTORY_STEPS = 100_000


def _fill(db: str, run_dir: Path) -> int:
    from runner.spec.recipe import load_recipe
    from store import Store

    store = Store(db)
    recipe = load_recipe(ROOT / "recipes" / "quickstart.toml", ["launch.strategy=ddp", "launch.nproc=8"])
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    (run_dir / "logs" / "rank0.log").write_text("training\n")
    run_id = store.create_run(name="bench-8gpu", recipe_text=recipe.to_toml(), recipe_hash=recipe.digest(),
                              strategy="ddp", nproc=8, method="lora", model=recipe.model.name, run_dir=str(run_dir),
                              total_steps=HISTORY_STEPS * 2)
    from store.store import utcnow

    store.update_run(run_id, status="running", started_at=utcnow())
    t0 = time.time() - HISTORY_STEPS * 0.01
    events = [{"seq": s, "type": "step", "time": t0 + s * 0.01, "step": s, "loss": 5.0 / (1 + s / 1000),
               "lr": 1e-3, "tokens_per_s": 2000.0, "step_time": 0.01} for s in range(1, HISTORY_STEPS + 1)]
    for i in range(0, len(events), 10_000):
        store.ingest(run_id, events[i:i + 10_000])
    return run_id


def _writer(db: str, run_id: int, seconds: float) -> None:
    """Child process: 2 Hz of 8 fake GPUs and 8 ranks, one step per tick (what a real run writes)."""
    from runner.hardware import Probe
    from store import Store

    store = Store(db)
    probe = Probe.fake(8)
    step = HISTORY_STEPS
    end = time.time() + seconds
    while time.time() < end:
        samples, procs = probe.sample({r: os.getpid() for r in range(8)})
        store.add_samples(run_id, samples, procs)
        step += 1
        store.ingest(run_id, [{"seq": step, "type": "step", "time": time.time(), "step": step, "loss": 1.0,
                               "lr": 1e-3, "tokens_per_s": 2000.0, "step_time": 0.5}])
        time.sleep(0.5)


def _app_child(db: str, mode: str, run_id: int, seconds: float) -> None:
    from tui.app.app import dashboard  # what ``ftui`` runs

    app = dashboard(db)
    drawn: list[float] = []
    display = app._display

    def _display(screen: object, renderable: object) -> None:
        # The first frame drawn after the store's runs reached the table: the screen with its rows.
        if not drawn and getattr(app.screen, "loaded", False):
            drawn.append(time.monotonic())
        display(screen, renderable)  # type: ignore[arg-type]

    app._display = _display  # type: ignore[method-assign]

    async def main() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            framed = time.monotonic()  # the Runs screen is composed and mounted: its first frame
            await pilot.pause()
            if mode == "paint":
                while not drawn:
                    await asyncio.sleep(0.002)
                print(json.dumps({"framed": framed, "painted": drawn[0]}), flush=True)
                return
            app.open_run(run_id)
            await pilot.pause(float(os.environ.get("FTUI_BENCH_WARMUP_S", "2")))  # first full read of the history (and of the run list) is start-up, not steady state
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            w0 = time.monotonic()
            await pilot.pause(seconds)
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
            print(json.dumps({"cpu_s": cpu, "wall_s": time.monotonic() - w0}), flush=True)

    asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--child", nargs=3, metavar=("DB", "MODE", "RUN_ID"))
    parser.add_argument("--writer", nargs=2, metavar=("DB", "RUN_ID"))
    args = parser.parse_args()
    if args.child:
        _app_child(args.child[0], args.child[1], int(args.child[2]), args.seconds)
        return
    if args.writer:
        _writer(args.writer[0], int(args.writer[1]), args.seconds)
        return
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "FTUI_HOME": tmp}
        db = f"sqlite:///{tmp}/ftui.db"
        run_id = _fill(db, Path(tmp) / "run")
        paints, frames = [], []
        for _ in range(3):
            t0 = time.monotonic()
            out = subprocess.run([sys.executable, __file__, "--child", db, "paint", str(run_id)], env=env,
                                 capture_output=True, text=True, check=True).stdout
            got = json.loads(out.strip().splitlines()[-1])
            paints.append(got["painted"] - t0)
            frames.append(got["framed"] - t0)
        writer = subprocess.Popen([sys.executable, __file__, "--writer", db, str(run_id),
                                   "--seconds", str(args.seconds + 8)], env=env)
        out = subprocess.run([sys.executable, __file__, "--child", db, "monitor", str(run_id),
                              "--seconds", str(args.seconds)], env=env, capture_output=True, text=True, check=True).stdout
        writer.wait()
        mon = json.loads(out.strip().splitlines()[-1])
    print(f"first paint (spawn to the Runs screen showing its runs, headless, {HISTORY_STEPS:,}-step run in the "
          f"store): best {min(paints):.2f} s, runs {', '.join(f'{p:.2f}' for p in paints)} (target <= 1 s); "
          f"the screen's first frame (before the store answers): {', '.join(f'{p:.2f}' for p in frames)} s")
    print(f"monitor, 8 fake GPUs + 8 ranks at 2 Hz, {HISTORY_STEPS:,}-point loss history: "
          f"{100 * mon['cpu_s'] / mon['wall_s']:.1f}% of one core over {mon['wall_s']:.0f} s (target <= 5%)")


if __name__ == "__main__":
    main()
