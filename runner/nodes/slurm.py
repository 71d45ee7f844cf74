"""SLURM: the sbatch script of a multi-node run, submitting it, the job's state, cancelling it.

The script (:func:`sbatch_script`, pure) follows what torchtitan, axolotl and torchtune ship: one task per
node (``--ntasks-per-node=1``), the head node from ``scontrol show hostnames "$SLURM_JOB_NODELIST"``,
and ``srun`` starting one node agent per node (``ftui run RECIPE --nnodes $SLURM_NNODES
--rdzv-endpoint HEAD:PORT``) with a c10d rendezvous: torch assigns node ranks by arrival, so nothing in
the script or the agents assumes which node gets which rank. The store URL is passed through
(``FTUI_DB``), and the run key is ``slurm-$SLURM_JOB_ID``: :func:`store.nodes.open_slurm_run` records the
run when the job is submitted, and every node agent of the job joins that row.

Stopping goes through ``scancel --signal=TERM`` (:func:`cancel`): SLURM delivers SIGTERM to every task
(the node agents), which stop their ranks gracefully (they finish the step and checkpoint), rather than
SIGINT colliding with SLURM's own signals. Commands are argv lists, never a shell string.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

RDZV_PORT = 29500


class SlurmError(RuntimeError):
    """A SLURM command failed or is missing (one line)."""


@dataclass(frozen=True)
class SlurmJob:
    """What ``ftui slurm`` asks of SLURM.

    Attributes:
        recipe: the recipe file (absolute: the job runs it from the submit folder's view of the shared disk).
        nodes: machines.
        gpus_per_node: GPUs per machine (0: CPU only; ranks per node are ``nproc_per_node``).
        nproc_per_node: ranks per machine (default: one per GPU, else 1).
        db_url: the store every node writes to (must be reachable from the nodes: PostgreSQL, or SQLite on
            a shared disk for small jobs).
        partition, time, account: ``#SBATCH`` options, left out when None.
        overrides: ``--set`` overrides passed on.
        python: the interpreter on the nodes (this one by default: a shared install).
        workdir: the folder the job starts in, where SLURM writes its output file.
        ftui_home: the data folder on the nodes (None: the default, ``FTUI_HOME`` or the user's).
    """

    recipe: Path
    nodes: int
    gpus_per_node: int
    db_url: str
    nproc_per_node: int | None = None
    partition: str | None = None
    time: str | None = None
    account: str | None = None
    overrides: tuple[str, ...] = ()
    python: str = sys.executable
    workdir: Path | None = None
    ftui_home: str | None = None
    name: str = "ftui"
    port: int = RDZV_PORT
    resume: int | None = None
    """A run to resume (``ftui resume ID --rdzv-endpoint``: the run's own recipe) instead of ``recipe``."""
    force: bool = False
    """Each node starts more ranks than it has devices for (``--force`` on each node's command)."""

    @property
    def ranks_per_node(self) -> int:
        return self.nproc_per_node or max(1, self.gpus_per_node)


def sbatch_script(job: SlurmJob) -> str:
    """The sbatch script of ``job`` (pure). Values are shell-quoted; the rest is fixed text."""
    q = shlex.quote
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={q(job.name)}",
        f"#SBATCH --nodes={job.nodes}",
        "#SBATCH --ntasks-per-node=1",
    ]
    if job.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={job.gpus_per_node}")
    for option, value in (("partition", job.partition), ("time", job.time), ("account", job.account)):
        if value:
            lines.append(f"#SBATCH --{option}={q(value)}")
    lines += [
        "#SBATCH --output=ftui-%j.out",
        *([f"#SBATCH --chdir={q(str(job.workdir))}"] if job.workdir else []),
        "# Written by `ftui slurm`: one node agent per node, c10d rendezvous at the job's first node.",
        "set -euo pipefail",
        f"export FTUI_DB={q(job.db_url)}",
        *([f"export FTUI_HOME={q(job.ftui_home)}"] if job.ftui_home else []),
        'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
        "# Node ranks come from the rendezvous (c10d assigns them by arrival), never from SLURM's task order.",
        "srun --kill-on-bad-exit=0 \\",
        *([f"    {q(job.python)} -m tui.cli resume {job.resume} --nnodes \"$SLURM_NNODES\" \\"] if job.resume
          is not None else [f"    {q(job.python)} -m tui.cli run {q(str(job.recipe))} \\",
                            f"    --nnodes \"$SLURM_NNODES\" --nproc {job.ranks_per_node} \\"]),
        f"    --rdzv-endpoint \"$head_node:{job.port}\" --run-key \"slurm-$SLURM_JOB_ID\"" +
        (" --force" if job.force else "") + (" \\" if job.overrides else ""),
    ]
    if job.overrides:
        lines.append("    " + " ".join(f"--set {q(o)}" for o in job.overrides))
    return "\n".join(lines) + "\n"


def _run(argv: list[str], timeout: float = 30.0) -> str:
    if shutil.which(argv[0]) is None:
        raise SlurmError(f"{argv[0]}: not found (is this a SLURM login node?)")
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{argv[0]}: no answer within {timeout:.0f} s") from None
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        raise SlurmError(f"{' '.join(argv[:2])}: {detail[-1] if detail else f'exit {proc.returncode}'}")
    return proc.stdout


def submit(script: Path) -> str:
    """``sbatch --parsable SCRIPT``; the job id."""
    out = _run(["sbatch", "--parsable", str(script)]).strip()
    job_id = out.split(";", 1)[0]
    if not job_id.isdigit():
        raise SlurmError(f"sbatch: unexpected answer {out!r}")
    return job_id


def job_state(job_id: str) -> str | None:
    """The job's state in lower case (``pending``, ``running``, ``completed``, ``failed``, ``cancelled``...):
    ``squeue`` while SLURM still lists it, then ``sacct``; None when neither knows it (or is missing)."""
    try:
        state = _run(["squeue", "-h", "-j", job_id, "-o", "%T"], timeout=10).strip()
    except SlurmError:
        state = ""
    if not state:
        try:
            rows = _run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"], timeout=10).split()
        except SlurmError:
            return None
        state = rows[0] if rows else ""
    return state.split()[0].lower() if state else None


def cancel(job_id: str, kill: bool = False) -> None:
    """Stop a job: ``scancel --signal=TERM`` (every task, i.e. each node agent, stops its ranks gracefully:
    they finish the step and checkpoint), or ``scancel`` at once with ``kill``."""
    _run(["scancel", job_id] if kill else ["scancel", "--signal=TERM", job_id])
