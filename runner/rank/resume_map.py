"""The trainer's side of a c10d resume (:mod:`runner.nodes.c10d_resume`): which old node's folder this node loads.

Under a c10d rendezvous a node learns its node rank only once the rendezvous is done, after its agent
wrote the recipe. So the agent leaves in the run folder a map from the old run's node ranks to their
checkpoint folders (:data:`MAP_FILE`), and each rank picks its node's entry from the node rank torchrun gave
it (``GROUP_RANK``, else ``RANK // LOCAL_WORLD_SIZE``): read from the environment, never assumed. Kept free of
heavy imports: the trainer imports it before torch.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

MAP_FILE = "resume_nodes.json"
"""``{"step": S, "by_node_rank": {"0": CHECKPOINT_FOLDER, ...}}`` in a c10d resume's run folder."""


def write_map(run_dir: Path, step: int, by_node_rank: dict[int, str]) -> Path:
    """Write the map of a c10d resume into ``run_dir`` (through a temporary name and a rename)."""
    path = run_dir / MAP_FILE
    tmp = path.with_name(f".{MAP_FILE}.tmp")
    tmp.write_text(json.dumps({"step": step, "by_node_rank": {str(k): v for k, v in sorted(by_node_rank.items())}},
                              indent=2) + "\n")
    os.replace(tmp, path)
    return path


def node_rank(env: dict[str, str] | None = None) -> int:
    """This process's node rank as torchrun set it: ``GROUP_RANK``, else ``RANK // LOCAL_WORLD_SIZE``.

    Raises:
        ValueError: one line, when the environment says neither.
    """
    env = dict(os.environ) if env is None else env
    if env.get("GROUP_RANK", "").isdigit():
        return int(env["GROUP_RANK"])
    if env.get("RANK", "").isdigit() and env.get("LOCAL_WORLD_SIZE", "").isdigit():
        return int(env["RANK"]) // int(env["LOCAL_WORLD_SIZE"])
    raise ValueError("train.resume_from: a c10d resume needs the node rank from torchrun (GROUP_RANK, or RANK and "
                     "LOCAL_WORLD_SIZE), and the environment has neither")


def recipe_for_node(recipe: Any, run_dir: Path, env: dict[str, str] | None = None) -> Any:
    """``recipe`` with ``train.resume_from`` set to this node's old folder when ``run_dir`` holds a c10d
    resume's map; unchanged otherwise (a static resume, or no resume: the recipe already says it)."""
    path = run_dir / MAP_FILE
    if not path.is_file():
        return recipe
    by_rank = json.loads(path.read_text())["by_node_rank"]
    # One machine (a one-node SLURM job): node rank 0, and one process may run without torchrun's variables.
    rank = 0 if list(by_rank) == ["0"] else node_rank(env)
    if str(rank) not in by_rank:
        raise ValueError(f"train.resume_from: {path} has no folder for node rank {rank} "
                         f"(node ranks {', '.join(sorted(by_rank))})")
    return recipe.model_copy(update={"train": recipe.train.model_copy(update={"resume_from": by_rank[str(rank)]})})
