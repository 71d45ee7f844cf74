"""A real SLURM cluster of one node for tests: munged, slurmctld and slurmd on this machine, with a
slurm.conf generated in a temp folder (Debian's ``slurm-wlm`` and ``munge``; .ci/run installs them).

Where the daemons cannot start (no binaries, not root, a container that refuses them) the tests that ask
for ``slurm_cluster`` skip, saying why. Registered in conftest.py (``pytest_plugins``).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

DAEMONS = ("munged", "slurmctld", "slurmd")


def _why_not() -> str | None:
    for binary in ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd"):
        if not Path(binary).is_file():
            return f"{binary} not found: apt-get install slurm-wlm munge"
    for binary in ("sbatch", "squeue", "sacct", "scancel", "scontrol", "runuser"):
        if shutil.which(binary) is None:
            return f"{binary} not found: apt-get install slurm-wlm munge"
    if os.geteuid() != 0:
        return "slurmd needs root to start jobs (tests run as a user)"
    if not Path("/etc/munge/munge.key").is_file():
        return "/etc/munge/munge.key missing (the munge package creates it)"
    return None


def _conf(root: Path) -> str:
    cpus = os.cpu_count() or 1
    mem_mb = max(256, (os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) // (1 << 20) // 2)
    ctl, slurmd = random.randint(20000, 29000), random.randint(30000, 39000)
    return "\n".join([
        "ClusterName=ftuitest", "SlurmctldHost=localhost", "SlurmUser=root", "SlurmdUser=root",
        f"SlurmctldPort={ctl}", f"SlurmdPort={slurmd}",
        "AuthType=auth/munge", f"AuthInfo=socket={root}/munge/munge.socket",
        f"StateSaveLocation={root}/state", f"SlurmdSpoolDir={root}/spool",
        f"SlurmctldPidFile={root}/slurmctld.pid", f"SlurmdPidFile={root}/slurmd.pid",
        f"SlurmctldLogFile={root}/slurmctld.log", f"SlurmdLogFile={root}/slurmd.log",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SchedulerType=sched/builtin",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "ReturnToService=2", "MpiDefault=none",
        "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none", "KillWait=30",
        f"NodeName=localhost NodeHostname={socket.gethostname()} CPUs={cpus} RealMemory={mem_mb} State=UNKNOWN",
        "PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP",
    ]) + "\n"


def _pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie, ended but not yet reaped by init, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _until(condition: Callable[[], bool], timeout: float) -> bool:
    """Check ``condition`` every 0.1 s until it holds (True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[dict[str, str]]:
    """A one-node SLURM cluster; yields the environment (``SLURM_CONF``) its commands need."""
    why = _why_not()
    if why:
        pytest.skip(f"SLURM: {why}")
    root = Path(tempfile.mkdtemp(prefix="ftui-slurm-", dir="/tmp"))  # the daemons reach it: not in pytest's private folders
    root.chmod(0o755)
    for sub in ("munge", "state", "spool"):
        (root / sub).mkdir()
    shutil.chown(root / "munge", "munge", "munge")
    (root / "munge").chmod(0o700)
    conf = root / "slurm.conf"
    conf.write_text(_conf(root))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    pids = {"munged": root / "munge" / "munged.pid", "slurmctld": root / "slurmctld.pid",
            "slurmd": root / "slurmd.pid"}
    starts = {
        "munged": ["runuser", "-u", "munge", "--", "/usr/sbin/munged", f"--socket={root}/munge/munge.socket",
                   f"--pid-file={pids['munged']}", f"--log-file={root}/munge/munged.log",
                   f"--seed-file={root}/munge/seed", "-f"],
        "slurmctld": ["/usr/sbin/slurmctld", "-f", str(conf)],
        "slurmd": ["/usr/sbin/slurmd", "-f", str(conf)],
    }
    # Each daemon is up once it wrote its pid file (munged: once its socket is there, which slurmctld needs).
    ready = {"munged": root / "munge" / "munge.socket", "slurmctld": pids["slurmctld"], "slurmd": pids["slurmd"]}
    states: list[str] = []

    def node_up() -> bool:
        states.append(subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True,
                                     timeout=30).stdout.strip())
        return states[-1] in ("idle", "mixed", "allocated")

    try:
        for name in DAEMONS:
            proc = subprocess.run(starts[name], env=env, capture_output=True, text=True, timeout=60)
            if proc.returncode != 0:
                pytest.skip(f"SLURM: {name} did not start: {(proc.stderr or proc.stdout).strip()[-300:]}")
            if not _until(ready[name].exists, 30):
                pytest.skip(f"SLURM: {name} started but {ready[name]} never appeared")
        if not _until(node_up, 60):
            logs = (root / "slurmd.log").read_text()[-300:] if (root / "slurmd.log").exists() else ""
            pytest.skip(f"SLURM: the node never became idle (sinfo: {states[-1] or 'nothing'}); slurmd.log: {logs}")
        yield {"SLURM_CONF": str(conf)}
    finally:
        stopped = []
        for name in reversed(DAEMONS):
            pid = _pid(pids[name])
            if pid:
                try:
                    os.kill(pid, signal.SIGTERM)
                    stopped.append(pid)
                except ProcessLookupError:
                    pass
        _until(lambda: not any(_alive(pid) for pid in stopped), 10)
        shutil.rmtree(root, ignore_errors=True)
