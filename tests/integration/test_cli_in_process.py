"""``Ftui.call``, the tests' in-process ``ftui``, gives what a fresh ``ftui`` process gives: the same exit
code, stdout and stderr, byte for byte, for every read command; it leaves the test's process as it found it
(environment, folder, logging, warning filters, no database left open); a terminal of the test's process is
not seen; and it refuses what must run in a real process."""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

import pytest

from store import Store
from tests.support import QUICKSTART, ROOT, Ftui, new_home
from tests.support.in_process import fresh_process_state, run_ftui

MODEL_DIMS = {"layers": 2, "heads": 4, "head_dim": 8, "seq_len": 16}


def add(store: Store, name: str, strategy: str, nproc: int, tps: float) -> int:
    """A completed run recorded through the store API (no training): three steps, a throughput."""
    text = f'[launch]\nstrategy = "{strategy}"\nnproc = {nproc}\n[train]\nbatch_size = {2 // nproc}\ngrad_accum = 1\n'
    rid = store.create_run(name=name, recipe_text=text, recipe_hash="r", strategy=strategy, nproc=nproc,
                           method="lora", model="builtin:tiny-llama", run_dir="")
    store.ingest(rid, [{"seq": s, "type": "step", "time": 1000.0 + s, "step": s, "loss": 5.0 - 0.1 * s, "lr": 1e-3,
                        "grad_norm": 0.5, "tokens_per_s": tps} for s in range(1, 4)])
    store.update_run(rid, status="completed", tokens_per_s=tps, train_seconds=3.0, final_loss=4.7, host="vm",
                     summary={"model_dims": MODEL_DIMS, "world_size": nproc})
    return rid


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Ftui:
    """A home with two completed runs, one of them with a name longer than 80 columns."""
    ftui = new_home(tmp_path_factory.mktemp("in-process"))
    store = Store(ftui.db)
    add(store, "single-" + "x" * 90, "single", 1, 1000.0)
    add(store, "ddp", "ddp", 2, 1700.0)
    store.close()
    return ftui


READS = [
    ["runs"], ["runs", "--format", "json"], ["show", "1"], ["show", "2", "--format", "json"], ["compare", "1", "2"],
    ["estimate", str(QUICKSTART)], ["db", "current"], ["runs", "--help"], ["show", "99"], ["compare", "1", "x"],
]


def test_a_read_in_process_prints_what_a_real_process_prints(home: Ftui) -> None:
    for argv in READS:
        real, here = home.run(*argv), home.call(*argv)
        assert (here.returncode, here.stdout, here.stderr) == (real.returncode, real.stdout, real.stderr), argv
    assert "x" * 90 not in home.call("runs").stdout, "80 columns: the long name is cut, as in a pipe"


def test_a_terminal_of_the_test_process_is_not_seen(home: Ftui, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``pytest -s`` in a 200-column terminal, the call still prints as a process whose output is a
    pipe: 80 columns; ``COLUMNS`` in its environment is still obeyed."""
    narrow = home.call("runs").stdout
    monkeypatch.setattr(os, "get_terminal_size", lambda fd=1: os.terminal_size((200, 50)))
    assert home.call("runs").stdout == narrow and max(map(len, narrow.splitlines())) <= 80
    code, wide, _ = run_ftui(["runs"], {**home.env, "COLUMNS": "200"}, ROOT)
    assert code == 0 and "x" * 90 in wide
    assert os.get_terminal_size() == (200, 50), "the test's own answer is back after the call"


def test_the_call_leaves_the_process_as_it_found_it(home: Ftui, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    environ, handlers, filters = dict(os.environ), logging.getLogger().handlers[:], warnings.filters[:]
    proc = home.call("db", "current")
    assert proc.returncode == 0 and proc.stdout.startswith(home.db)
    assert dict(os.environ) == environ
    assert Path.cwd() == tmp_path and logging.getLogger().handlers == handlers and warnings.filters == filters
    db_file = str(home.home / "ftui.db")
    open_files = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                  if os.path.exists(f"/proc/self/fd/{fd}")]
    assert not [f for f in open_files if f.startswith(db_file)], "the database the call opened is closed"


def test_what_the_call_sets_in_the_environment_is_taken_back(home: Ftui) -> None:
    environ = dict(os.environ)
    code, out, _ = run_ftui(["db", "current"], {**home.env, "FTUI_ONLY_IN_THE_CALL": "1"}, ROOT)
    assert code == 0 and "FTUI_ONLY_IN_THE_CALL" not in os.environ and dict(os.environ) == environ


def test_logging_and_warnings_print_to_the_calls_stderr_as_in_a_fresh_process(
        capsys: pytest.CaptureFixture[str]) -> None:
    """No logging handler: a warning is printed by Python's last resort; the default warning filters: a
    UserWarning is printed once per call (as once per process), a DeprecationWarning of a library never."""
    capsys.readouterr()
    for _ in range(2):
        with fresh_process_state():
            logging.getLogger("runner.somewhere").warning("disk almost full")
            warnings.warn("careful", UserWarning, stacklevel=1)
            warnings.warn_explicit("old", DeprecationWarning, "lib.py", 1, module="lib")
    err = capsys.readouterr().err
    assert "disk almost full" in err and err.count("UserWarning: careful") == 2 and "old" not in err


@pytest.mark.parametrize("argv", [["run", str(QUICKSTART)], ["sweep", str(QUICKSTART)], ["stop", "1"],
                                  ["resume", "1"], ["recover"], ["estimate", str(QUICKSTART), "--probe"],
                                  ["gpus", "--watch", "1"], ["--notify"], ["run", "--script", "x.py", "--", "--dry-run"]])
def test_what_forks_trains_or_never_ends_is_refused(home: Ftui, argv: list[str]) -> None:
    with pytest.raises(AssertionError, match="run it with Ftui.run"):
        home.call(*argv)


def test_a_dry_run_is_called_in_process(home: Ftui) -> None:
    proc = home.call("sweep", str(QUICKSTART), "--strategies", "single,ddp", "--dry-run")
    assert proc.returncode == 0 and proc.stdout.startswith("1. single x 1"), proc.stderr
