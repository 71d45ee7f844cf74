"""The README's commands, run as written (tests/support/readme.py lists them and says where the others run):
the first five minutes in a fresh home (one real training: ``ftui run recipes/quickstart.toml``), and the
comparison as a reopening of the shared matrix's sweep, which trains the README's sweep as a part of its own."""

from __future__ import annotations

from pathlib import Path

from tests.support import QUICKSTART, ROOT, new_home
from tests.support.matrix import COMMON, CORE, Matrix
from tests.support.readme import RUN, SWEEP


def test_the_readme_first_five_minutes_in_a_fresh_home(tmp_path: Path) -> None:
    home = new_home(tmp_path / "home")
    printed: dict[str, str] = {}
    for command in RUN:
        if "--sweep" in command:
            continue  # reopens a sweep: the test below
        proc = home.run(*command.split()[1:], timeout=900)
        assert proc.returncode == 0, f"{command}: exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        printed[command] = proc.stdout
    run = home.show(1)
    assert (run["status"], run["name"], len(run["metrics"])) == ("completed", "quickstart", 30)
    assert "quickstart" in printed["ftui runs"] and "completed" in printed["ftui show 1"]
    assert "recommendation" in printed["ftui estimate recipes/tinyllama-1.1b-lora.toml --gpu-mem 48GiB --gpus 4"]
    assert "accelerate" in printed["ftui run recipes/quickstart.toml --strategy ddp --nproc 2 --dry-run"]
    demo = printed["ftui --fake-gpus 8 gpus"]
    assert "fake NVML" in demo and demo.count("H100") == 8, demo
    assert [r["id"] for r in home.runs()] == [1], "a dry run records nothing"


def test_the_readme_comparison_is_the_matrix_sweep_reopened(matrix: Matrix, tmp_path: Path) -> None:
    """The README's sweep is a part of the matrix's (the same recipe, process count and steps; strategies among
    its strategies); its report command runs as written on that sweep."""
    words = SWEEP.split()
    assert words[:3] == ["ftui", "sweep", str(QUICKSTART.relative_to(ROOT))]
    flags = dict(zip(words[3::2], words[4::2], strict=True))
    assert set(flags["--strategies"].split(",")) <= set(CORE)
    assert flags["--nproc"] == "2" and flags["--set"] in COMMON
    sweep = matrix.sweep()
    report = tmp_path / "report.html"
    command = next(c for c in RUN if "--sweep" in c).replace("ID", sweep.id).replace("report.html", str(report))
    matrix.ftui.run(*command.split()[1:], check=True)
    html = report.read_text()
    assert html.startswith("<!DOCTYPE html>")
    for strategy in flags["--strategies"].split(","):
        assert f"run {sweep.run_ids[strategy]} " in html, strategy  # its curves, labelled by run
