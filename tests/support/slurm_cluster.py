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
from collections.abc import Iterator
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


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[dict[str, str]]:
    """A one-node SLURM cluster; yields the environment (``SLURM_CONF``) its commands need."""
    why = _why_not()
    if why:
        pytest.skip(f"SLURM: {why}")
    root = Path(tempfile.mkdtemp(prefix="ftui-slurm-"))
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
    try:
        for name in DAEMONS:
            proc = subprocess.run(starts[name], env=env, capture_output=True, text=True, timeout=60)
            if proc.returncode != 0:
                pytest.skip(f"SLURM: {name} did not start: {(proc.stderr or proc.stdout).strip()[-300:]}")
            time.sleep(0.5)
        deadline = time.monotonic() + 60
        state = ""
        while time.monotonic() < deadline:
            state = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True).stdout.strip()
            if state in ("idle", "mixed", "allocated"):
                break
            time.sleep(1)
        else:
            logs = (root / "slurmd.log").read_text()[-300:] if (root / "slurmd.log").exists() else ""
            pytest.skip(f"SLURM: the node never became idle (sinfo: {state or 'nothing'}); slurmd.log: {logs}")
        yield {"SLURM_CONF": str(conf)}
    finally:
        for name in reversed(DAEMONS):
            pid = _pid(pids[name])
            if pid:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        time.sleep(1)
        shutil.rmtree(root, ignore_errors=True)
