"""``ftui compare`` refuses bad ids and flags in one line naming what is wrong, exit 2. Through ``main`` in
this process on the session's home (the real process's refusal: tests/integration/test_bad_arguments.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.support import QUICKSTART, ROOT, CliResult, Ftui, run_in_process

Cli = Callable[..., CliResult]


@pytest.fixture
def cli(ftui: Ftui, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Cli:
    """``ftui ARGS`` on the session's home, in this process (a sweep refused before it trains included)."""
    monkeypatch.setenv("FTUI_HOME", str(ftui.home))
    monkeypatch.setenv("FTUI_DB", ftui.db)
    monkeypatch.chdir(ROOT)
    return lambda *args: run_in_process(capsys, *args)


def test_bad_input_is_one_line_and_exit_2(cli: Cli) -> None:
    for args in (["compare"], ["compare", "9999"], ["compare", "--sweep", "no-such-sweep"],
                 ["sweep", str(QUICKSTART), "--strategies", "single,warp"],
                 ["sweep", str(QUICKSTART), "--grid", "train.batch_size"]):
        proc = cli(*args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert proc.stderr.startswith("ftui: ") and "Traceback" not in proc.stderr, proc.stderr

@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["compare", "1", "-o", "/missing/dir/x.md"], "-o/--output"),
        (["compare", "1", "--baseline", "99"], "--baseline 99"),
        (["compare", "1", "--peak-tflops", "-5"], "--peak-tflops"),
        (["compare", "1", "--peak-tflops", "nan"], "--peak-tflops"),
        (["sweep", str(QUICKSTART), "--nproc", "0"], "--nproc"),
        (["sweep", str(QUICKSTART), "--peak-tflops", "0"], "--peak-tflops"),
        (["sweep", str(QUICKSTART), "-o", "/missing/dir/x.html", "--format", "html"], "-o/--output"),
    ],
)
def test_bad_flags_are_one_line_naming_the_flag(cli: Cli, args: list[str], named: str) -> None:
    proc = cli(*args)
    assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ftui: ") and named in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and "sweep-" not in proc.stdout  # nothing ran
