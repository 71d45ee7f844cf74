"""The README's commands, read from its ``bash`` blocks, and how the tests cover each one.

Every command of the README is either run for real by ``tests/e2e/test_readme.py`` (:data:`RUN`, in a home
of its own or, for the comparison, on the shared matrix's sweep) or mapped to the test that runs it
(:data:`ELSEWHERE`). ``tests/unit/test_readme.py`` holds the README to exactly these: a command added to the
README without a test that runs it fails there.
"""

from __future__ import annotations

import re
import shlex

from tests.support import ROOT

README = ROOT / "README.md"
CI = ROOT / ".ci" / "run"

RUN = (
    "ftui run recipes/quickstart.toml",
    "ftui runs",
    "ftui show 1",
    "ftui report --sweep ID -o report.html",
    "ftui estimate recipes/tinyllama-1.1b-lora.toml --gpu-mem 48GiB --gpus 4",
    "ftui run recipes/quickstart.toml --strategy ddp --nproc 2 --dry-run",
    "ftui gpus",
    "ftui --fake-gpus 8 gpus",
)
"""Run for real, as written (``ID`` is the sweep's id, ``report.html`` a file of the test's own)."""

SWEEP = "ftui sweep recipes/quickstart.toml --strategies single,ddp,fsdp --nproc 2 --set train.max_steps=5"
"""Trained by the shared matrix's sweep (tests/support/matrix.py), of which it is a part: the test checks that
the matrix's sweep covers its recipe, strategies, process count and steps, then reopens that sweep."""

ELSEWHERE: dict[str, str] = {
    "pip install torch==2.13.0 -e .": ".ci/run",
    "pip install torch==2.13.0 -e .[test]": ".ci/run",
    "python -m pytest": ".ci/run",
    SWEEP: "tests/e2e/test_readme.py::test_the_readme_comparison_is_the_matrix_sweep_reopened",
    "ftui": "tests/system/test_tmux.py::test_tmux_drive",
    "ftui run recipes/quickstart.toml --strategy fsdp --nproc 2":
        "tests/e2e/test_training.py::test_each_strategy_completes_and_stores_its_metrics",
    "ftui stop ID": "tests/integration/test_stop_signals.py::test_ftui_stop_from_another_process",
    "ftui resume ID":
        "tests/e2e/test_checkpoint.py::test_ctrl_c_stops_every_rank_checkpoints_and_ftui_resume_finishes_the_run",
}
"""Commands a test elsewhere runs: installs (tests never install software; CI runs the README's test line,
whose install is a superset of the main job's), the test command itself (CI), the dashboard (driven in a real
terminal by tmux), and commands whose behaviour needs a run of their own (a stop, a resume, FSDP)."""


def commands(text: str | None = None) -> list[str]:
    """Each command of the README's ``bash`` blocks, as its words (quotes removed) joined by one space:
    backslash continuations joined, comments dropped, ``a && b`` as two commands."""
    text = README.read_text() if text is None else text
    found: list[str] = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            while words:
                cut = words.index("&&") if "&&" in words else len(words)
                found.append(" ".join(words[:cut]))
                words = words[cut + 1:]
    return found
