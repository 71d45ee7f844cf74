"""The sharding verdict (runner/analysis/shard_verdict.py) on hand-made ranks: each rank's measured bytes
against the whole, for every kind of promise (replicated, sharded 1/N, split by layers, tensor-parallel
slices, one process), the failures it must name, and runs recorded before the whole was measured."""

from __future__ import annotations

from typing import Any

from runner.analysis.compare import build_comparison
from runner.analysis.shard_verdict import ABS_SLACK, REL_TOLERANCE, shard_verdict
from tests.support import run_info
from tui.render.compare_cells import columns, footnotes
from tui.render.report import sharding_rows

MIB = 1 << 20
WHOLE = {"param": 48 * MIB, "grad": 2 * MIB, "optimizer": 4 * MIB, "master": 0}


def rank(i: int, share: dict[str, float] | float, master: bool = False, **extra: int) -> dict[str, Any]:
    """Rank ``i`` holding ``share`` of each kind's whole (one number: of every kind)."""
    fractions = share if isinstance(share, dict) else dict.fromkeys(WHOLE, share)
    wholes = {**WHOLE, "master": 2 * MIB if master else 0}
    out: dict[str, Any] = {"rank": i}
    for kind, whole in wholes.items():
        out[f"{kind}_bytes"] = round(whole * fractions.get(kind, 0.0))
        out[f"{kind}_whole_bytes"] = whole
    return {**out, **extra}


def test_ddp_replicates_everything() -> None:
    v = shard_verdict("ddp", [rank(0, 1.0), rank(1, 1.0)])
    assert v.ok is True and v.short() == "as promised"
    assert v.line() == ("optimizer: replicated (as ddp promises); grads: replicated (as ddp promises); "
                        "params: replicated (as ddp promises)")


def test_fsdp_shards_every_kind_half_on_two_ranks() -> None:
    v = shard_verdict("fsdp", [rank(0, 0.5), rank(1, 0.5)])
    assert v.ok is True
    assert v.line() == "optimizer sharded 1/2: yes; grads sharded 1/2: yes; params sharded 1/2: yes"
    assert [c.shares() for c in v.checks] == [(0.5, 0.5)] * 3


def test_zero2_on_four_ranks_shards_optimizer_master_and_grads_and_replicates_params() -> None:
    half = {"optimizer": 0.25, "master": 0.25, "grad": 0.25, "param": 1.0}
    v = shard_verdict("zero2", [rank(i, half, master=True) for i in range(4)])
    assert v.ok is True
    assert v.line() == ("optimizer sharded 1/4: yes; fp32 master sharded 1/4: yes; grads sharded 1/4: yes; "
                        "params: replicated (as zero2 promises)")


def test_zero3_says_the_parameters_it_keeps_gathered_beside_the_partitions() -> None:
    gathered = 3 * MIB  # whole small parameters on every rank (DeepSpeed's persistence threshold)
    ranks = [rank(i, 0.5, param_gathered_bytes=gathered) for i in range(2)]
    for r in ranks:
        r["param_bytes"] += gathered
    v = shard_verdict("zero3", ranks)
    assert v.ok is True
    params = v.checks[-1]
    assert params.held == (24 * MIB, 24 * MIB) and params.gathered == gathered
    assert params.text == ("params sharded 1/2: yes (beside it each rank keeps 6% of them whole: ZeRO-3's "
                           "persistence threshold)")


def test_a_strategy_promising_a_shard_whose_ranks_hold_the_whole_fails_naming_the_kind() -> None:
    v = shard_verdict("fsdp", [rank(i, {"optimizer": 0.5, "grad": 0.5, "param": 1.0}) for i in range(2)])
    assert v.ok is False and v.short() == "NOT: params"
    assert v.checks[-1].text == "params: NOT sharded (fsdp promises 1/2; each rank holds 100%)"
    assert v.line().startswith("optimizer sharded 1/2: yes; grads sharded 1/2: yes; ")


def test_a_shard_held_by_one_rank_alone_is_not_sharded_though_nothing_is_duplicated() -> None:
    """FSDP1 with LoRA can leave every adapter in rank 0's part of the flat parameter."""
    v = shard_verdict("fsdp", [rank(0, {"optimizer": 1.0, "grad": 1.0, "param": 0.5}),
                               rank(1, {"optimizer": 0.0, "grad": 0.0, "param": 0.5})])
    assert v.short() == "NOT: optimizer, grads"
    assert v.checks[0].text == "optimizer sharded 1/2: NO, unevenly (rank 0 holds 100%, rank 1 0%)"


def test_shares_that_miss_part_of_the_whole_are_not_sharded() -> None:
    v = shard_verdict("zero1", [rank(i, {"optimizer": 0.3, "param": 1.0, "grad": 1.0}) for i in range(2)])
    assert v.checks[0].ok is False
    assert v.checks[0].text == "optimizer sharded 1/2: NO (the ranks together hold 60% of the whole)"


def test_the_tolerance_is_two_percent_of_the_share_plus_the_slack() -> None:
    share = WHOLE["optimizer"] / 2
    limit = share * (1 + REL_TOLERANCE) + ABS_SLACK
    inside = rank(0, 0.5) | {"optimizer_bytes": int(limit)}
    outside = rank(0, 0.5) | {"optimizer_bytes": int(limit) + 1}
    assert shard_verdict("fsdp", [inside, rank(1, 0.5)]).checks[0].ok is True
    assert shard_verdict("fsdp", [outside, rank(1, 0.5)]).checks[0].ok is False


def test_a_replicated_kind_held_in_part_is_said_and_not_failed() -> None:
    """DeepSpeed's ZeRO-1 keeps only its partition's gradients once they are reduced."""
    v = shard_verdict("zero1", [rank(i, {"optimizer": 0.5, "grad": 0.5, "param": 1.0}) for i in range(2)])
    assert v.ok is True
    assert v.checks[1].text == "grads: each rank holds 50%, less than zero1 promises (replicated)"


def test_a_pipeline_splits_by_layers_unevenly_and_fails_when_a_stage_holds_everything() -> None:
    parallel = {"kind": "pipeline", "stages": 2}
    split = [rank(0, 0.6), rank(1, 0.4)]
    v = shard_verdict("pp", split, parallel)
    assert v.ok is True
    assert v.checks[-1].text == "params: split by layers over 2 (rank 0 holds 60%, rank 1 40%)"
    whole = shard_verdict("pp", [rank(0, 1.0), rank(1, 0.4)], parallel)
    assert whole.ok is False and whole.checks[-1].text == (
        "params: NOT split by layers (pp promises each of 2 processes its stage; rank 0 holds 100%, rank 1 40%)")
    lost = shard_verdict("mp", [rank(0, 0.3), rank(1, 0.3)], parallel)  # a stage's layers held nowhere
    assert lost.ok is False


def test_model_parallel_in_one_process_holds_the_whole() -> None:
    v = shard_verdict("mp", [rank(0, 1.0)])
    assert v.ok is True and v.checks[-1].text == "params: whole on its one process"
    assert shard_verdict("single", [rank(0, 1.0)]).ok is True
    assert shard_verdict("single", [rank(0, 0.5)]).short() == "NOT: optimizer, grads, params"


def test_tensor_parallel_slices_over_tp_size_not_over_every_rank() -> None:
    """Two tensor-parallel groups of 2: each rank holds between half (every tensor split) and the whole."""
    parallel = {"kind": "tensor_parallel", "tp_size": 2, "data_parallel": 2}
    v = shard_verdict("tp", [rank(i, {"optimizer": 0.8, "grad": 0.8, "param": 0.63}) for i in range(4)], parallel)
    assert v.ok is True and {c.n for c in v.checks} == {2}
    assert v.checks[-1].text == "params: sliced over 2 (each rank holds 63%)"
    unsplit = shard_verdict("tp", [rank(i, 1.0) for i in range(4)], parallel)
    assert unsplit.short() == "NOT: optimizer, grads, params"
    assert unsplit.checks[-1].text == "params: NOT sliced (tp promises slices over 2; each rank holds 100%)"
    too_small = shard_verdict("tp", [rank(i, 0.3) for i in range(2)], {"tp_size": 2})
    assert too_small.ok is False  # below 1/tp_size: something is missing, not sliced


def test_a_run_recorded_before_the_whole_was_measured_is_not_measured_never_guessed() -> None:
    old = [{"rank": i, "param_bytes": 10, "grad_bytes": 1, "optimizer_bytes": 2, "master_bytes": 0} for i in range(2)]
    v = shard_verdict("fsdp", old)
    assert v.ok is None and v.checks == () and v.short() == "not measured"
    assert v.line() == "not measured (recorded before the whole was measured)"
    assert shard_verdict("fsdp", []).line() == "not measured (no rank reported its memory)"
    assert shard_verdict("hsdp-of-the-future", [rank(0, 1.0)]).ok is None


def test_a_kind_no_rank_could_measure_the_whole_of_is_not_measured_alone() -> None:
    ranks = [rank(i, 0.5) for i in range(2)]
    for r in ranks:
        del r["optimizer_whole_bytes"]  # no optimizer state on the rank to measure per element
    v = shard_verdict("fsdp", ranks)
    assert v.checks[0].ok is None and v.checks[0].text == "optimizer: not measured"
    assert v.ok is True  # what was measured is as promised


def test_show_prints_the_verdict_and_each_kinds_bytes_per_rank_against_the_whole() -> None:
    run = run_info(1, "fsdp", 2, 100.0, ranks=[rank(i, {"optimizer": 0.5, "grad": 0.5, "param": 1.0}) for i in range(2)])
    rows = {figure: (value, source) for figure, value, source in sharding_rows(run)}
    assert rows["sharding"] == ("NOT: params", "optimizer sharded 1/2: yes; grads sharded 1/2: yes; params: NOT "
                                               "sharded (fsdp promises 1/2; each rank holds 100%)")
    assert rows["params per rank"][0] == "48.0 MiB / 48.0 MiB of 48.0 MiB"
    assert rows["optimizer per rank"][0] == "2.0 MiB / 2.0 MiB of 4.0 MiB"
    assert sharding_rows(run_info(2, "single", 1, 100.0, ranks=[rank(0, 1.0)])) == []  # nothing divided


def test_compare_has_a_sharding_row_whose_failures_are_spelled_out_in_a_footnote() -> None:
    good = run_info(1, "ddp", 2, 100.0, ranks=[rank(i, 1.0) for i in range(2)])
    bad = run_info(2, "zero3", 2, 100.0, ranks=[rank(i, 1.0) for i in range(2)])
    old = run_info(3, "fsdp", 2, 100.0, ranks=[{"rank": i, "param_bytes": 10} for i in range(2)])
    cmp = build_comparison([good, bad, old], {})
    cells = {r.run_id: cell(r) for header, cell in columns(cmp) if header == "sharding" for r in cmp.rows}
    assert cells == {1: "as promised", 2: "NOT as promised [1]", 3: "not measured"}
    assert footnotes(cmp)[0] == ("[1] run 2 sharding: optimizer: NOT sharded (zero3 promises 1/2; each rank holds "
                                 "100%); grads: NOT sharded (zero3 promises 1/2; each rank holds 100%); params: NOT "
                                 "sharded (zero3 promises 1/2; each rank holds 100%)")


def test_hybrid_sharding_divides_over_each_group_of_its_mesh_not_over_every_rank() -> None:
    """hsdp 2x2: each group of 2 shards the whole; the 2 groups are replicas, so every rank holds half."""
    mesh = {"mesh": {"replicate": 2, "shard": 2}}
    v = shard_verdict("hsdp", [rank(i, 0.5) for i in range(4)], None, mesh)
    assert v.ok is True and {c.n for c in v.checks} == {2}
    assert v.line() == "optimizer sharded 1/2: yes; grads sharded 1/2: yes; params sharded 1/2: yes"
    assert shard_verdict("hsdp", [rank(i, 1.0) for i in range(4)], None, mesh).short() == "NOT: optimizer, grads, params"
    assert shard_verdict("hsdp", [rank(i, 0.5) for i in range(4)]).line() == "not measured (the rank recorded no mesh)"
