"""How a CPU rank's OpenMP threads wait: the default ftui gives CPU ranks, and the words a run records.

At the end of each parallel region an OpenMP thread waits for its partners. GNU OpenMP's default spins
(``GOMP_SPINCOUNT`` 300,000 turns) before it sleeps, on a core that a partner or another process needs.
On a shared host a 2-thread rank's training then collapses while the peak probe beside it does not (the
quickstart at 106-428 tokens/s spinning beside other load, against 586-1,362 yielding; its MFU 1.8-3.1x
apart under two loads; BENCHMARKS.md "CPU MFU under two loads"). A CPU run on a shared host is the common
case (a laptop, a CI box, a login node), so CPU ranks yield by default; a user's own setting of any of
:data:`WAIT_VARS` wins and is passed through untouched. GPU ranks keep OpenMP's default.

The runtime reads these variables once, as the library loads (with torch), so they are in the ranks'
environment from their start (:func:`runner.spec.launch.build_launch`).
"""

from __future__ import annotations

from collections.abc import Mapping

WAIT_POLICY = "OMP_WAIT_POLICY"
"""OpenMP's variable: ``PASSIVE`` (waiting threads yield their core) or ``ACTIVE`` (they spin)."""
SPIN_VARS = ("GOMP_SPINCOUNT", "KMP_BLOCKTIME")
"""How long a waiting thread spins before it sleeps: GNU OpenMP's (turns) and Intel OpenMP's (ms)."""
WAIT_VARS = (WAIT_POLICY, *SPIN_VARS)
"""The variables that decide how OpenMP threads wait; a user who set any of them decides."""
CPU_DEFAULT = "PASSIVE"
"""What ftui gives CPU ranks when the user set none of :data:`WAIT_VARS`."""


def rank_wait_env(on_cpu: bool, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables ftui adds to the ranks' environment for how OpenMP threads wait: ``OMP_WAIT_POLICY=PASSIVE``
    for ranks that train on the CPU, unless ``environ`` (the user's) sets any of :data:`WAIT_VARS`, which then
    reach the ranks as they are; nothing for GPU ranks."""
    if not on_cpu or any(name in environ for name in WAIT_VARS):
        return {}
    return {WAIT_POLICY: CPU_DEFAULT}


def wait_words(environ: Mapping[str, str]) -> str:
    """How the OpenMP threads of a process with ``environ`` wait, as the rest of "OpenMP waits ...": ``yield``
    (``OMP_WAIT_POLICY=PASSIVE``), ``spin`` (``ACTIVE``), ``spin (OpenMP's default)`` (nothing set), or the
    settings themselves when a spin length is set (``as set: GOMP_SPINCOUNT=10000``), which bounds the spin
    whatever the policy says."""
    policy = environ.get(WAIT_POLICY, "").strip()
    spins = [f"{name}={environ[name]}" for name in SPIN_VARS if name in environ]
    if spins:
        named = [f"{WAIT_POLICY}={policy}", *spins] if policy else spins
        return "as set: " + ", ".join(named)
    if policy.upper() == "PASSIVE":
        return "yield"
    if policy.upper() == "ACTIVE":
        return "spin"
    if policy:
        return f"as set: {WAIT_POLICY}={policy}"
    return "spin (OpenMP's default)"
