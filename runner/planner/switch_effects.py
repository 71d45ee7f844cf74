"""What each efficiency switch does to a run's estimate: every switch turned to its other state, estimated
beside the run as it is (``ftui estimate``, Compose and the recommendation list them). Pure; the rules of
each switch are in ``runner/spec/switches.py`` and ``runner/spec/kernels.py``, their memory terms in
``runner/planner/switches.py`` and ``runner/planner/activations.py``."""

from __future__ import annotations

from dataclasses import dataclass, replace

from runner.planner.inputs import EstimateInput
from runner.planner.memory import MemoryBreakdown, estimate
from runner.planner.switches import size_text
from runner.spec.kernels import ATTENTION


@dataclass(frozen=True)
class SwitchEffect:
    """What turning one switch does to this run's estimate (per device, from :func:`estimate`).

    Attributes:
        field: The recipe field (``model.attn_implementation``).
        state: Its value in the run, as text.
        to: The value the effect is for, as text (the other state of an on/off switch).
        part: Which figure it changes: ``activations`` (what one forward saves for backward, autocast's
            weight casts included), ``activations on the device`` (activation offload) or ``per device``
            (the whole estimate: model states move or shard); empty where nothing is modelled.
        before: That figure now, in bytes.
        after: That figure with the switch at ``to``.
    """

    field: str
    state: str
    to: str
    part: str
    before: int
    after: int

    @property
    def change(self) -> float | None:
        """``after / before - 1`` (None: nothing to compare)."""
        return self.after / self.before - 1 if self.before and self.part else None

    def sentence(self) -> str:
        """``activations 12.3 MiB -> 20.1 MiB (+63%, estimated)``."""
        if self.change is None:
            return "no memory effect modelled"
        return f"{self.part} {size_text(self.before)} -> {size_text(self.after)} ({self.change * 100:+.0f}%, estimated)"


_OFF_ON = {False: "false", True: "true"}


def _flags(inp: EstimateInput) -> list[tuple[str, str, str, EstimateInput, str]]:
    """Each switch's alternative to the run: (field, state, to, the run with it, the part it changes)."""
    out = [("model.attn_implementation", inp.attention, a, replace(inp, attention=a), "activations")
           for a in ATTENTION if a != inp.attention]
    out.append(("train.compile", _OFF_ON[inp.compiled], _OFF_ON[not inp.compiled],
                replace(inp, compiled=not inp.compiled), "activations"))
    other = "fsdp" if inp.strategy == "hsdp" else "hsdp"  # hybrid sharding against sharding over every process
    out.append(("launch.strategy", inp.strategy, other, replace(inp, strategy=other, shard=None), "per device"))
    cp = 2 if inp.cp_size == 1 else 1
    out.append(("launch.cp_size", str(inp.cp_size), str(cp), replace(inp, cp_size=cp), "activations"))
    out.append(("train.precision", "fp8" if inp.fp8 else inp.precision, inp.precision if inp.fp8 else "fp8",
                replace(inp, fp8=not inp.fp8, precision="bf16"), "per device"))  # fp8 computes the rest in bf16
    out.append(("train.activation_offload", _OFF_ON[inp.activation_offload], _OFF_ON[not inp.activation_offload],
                replace(inp, activation_offload=not inp.activation_offload), "activations on the device"))
    if inp.nvme_offload:
        out.append(("launch.offload", "nvme", "none", replace(inp, nvme_offload=False, offload_optimizer=False,
                                                                offload_params=False), "per device"))
    else:
        offload = "optimizer+params" if inp.offload_params else "optimizer" if inp.offload_optimizer else "none"
        out.append(("launch.offload", offload, "nvme",
                    replace(inp, nvme_offload=True, offload_optimizer=True, offload_params=True), "per device"))
    return out


def _figure(b: MemoryBreakdown, part: str) -> int:
    if part == "activations":
        return b.activations_stored
    return b.activations if part == "activations on the device" else b.total


def switch_effects(inp: EstimateInput) -> list[SwitchEffect]:
    """Every efficiency switch's effect on ``inp``'s estimate, the switch turned to its other state (each
    other attention implementation; context parallel 2, or 1 when on; hsdp, or fsdp from hsdp; NVMe offload,
    or none from it),
    whether or not the run could take it (the recipe's rules and the host say that:
    ``runner/spec/switches.py``, ``runner/spec/kernels.py``). Expert parallelism (``launch.ep_size``) has
    none: it is refused (``runner.spec.layout.EXPERT_PARALLEL_MISSING``)."""
    now = estimate(inp)
    out = []
    for field, state, to, other, part in _flags(inp):
        out.append(SwitchEffect(field, state, to, part, _figure(now, part), _figure(estimate(other), part)))
    out.append(SwitchEffect("launch.ep_size", "1", "2", "", 0, 0))
    return out
