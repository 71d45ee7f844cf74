"""Hugging Face datasets as ``data.source``: a folder written by ``save_to_disk``, a local dataset folder
(data files that ``datasets.load_dataset`` reads), or a script-free hub id (``org/name``, or ``hf:name``)
resolved from the local cache only: nothing is downloaded (``HF_DATASETS_OFFLINE=1``,
``HF_HUB_OFFLINE=1``). ``data.split`` and ``data.subset`` pick the split and configuration. Which sources
are datasets is :func:`runner.data.rows.is_dataset_source`.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

HUB_PREFIX = "hf:"
DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet", ".txt", ".arrow")
"""Files that make a folder a dataset ``datasets.load_dataset`` can read."""


class HFDataError(ValueError):
    """A dataset or split that cannot be read; one line naming it."""


def _offline() -> Any:
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        import datasets
    except ImportError:
        raise HFDataError("data.source: reading a Hugging Face dataset needs `datasets` "
                          "(pip install 'ftui[datasets]')") from None
    # The variables are read at import; transformers may have imported both libraries already.
    import huggingface_hub.constants

    huggingface_hub.constants.HF_HUB_OFFLINE = True
    datasets.config.HF_DATASETS_OFFLINE = True
    datasets.config.HF_HUB_OFFLINE = True
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    return datasets


def _saved_to_disk(path: Path) -> bool:
    return (path / "dataset_dict.json").is_file() or (path / "state.json").is_file()


def resolve(source: str) -> Path | str:
    """The local folder of a dataset source (a hub id is looked up in the local hub cache), or the hub id
    itself when only ``datasets``' own cache may hold it."""
    path = Path(source).expanduser()
    if not source.startswith(HUB_PREFIX) and path.is_dir():
        return path
    repo = source.removeprefix(HUB_PREFIX)
    _offline()
    from huggingface_hub import snapshot_download

    home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface").expanduser()
    cache = Path(os.environ.get("HF_HUB_CACHE") or home / "hub").expanduser()
    try:
        return Path(snapshot_download(repo, repo_type="dataset", local_files_only=True, cache_dir=str(cache)))
    except Exception:  # noqa: BLE001 (not in the hub cache: datasets' processed cache may still have it)
        return repo


def load_rows(source: str, split: str, subset: str | None, field: str = "data.source") -> list[dict[str, Any]]:
    """Every row of one split of a dataset source, as dicts.

    Raises:
        HFDataError: no such dataset locally, no such split or subset, or unreadable; one line naming it.
    """
    datasets = _offline()
    where = resolve(source)
    if isinstance(where, Path) and not _saved_to_disk(where) and not any(
            p.suffix.lower() in DATA_SUFFIXES for p in where.rglob("*") if p.is_file()):
        raise HFDataError(f"{field}: {source}: is a folder with no dataset in it (no save_to_disk output, "
                          "no data files)")
    try:
        if isinstance(where, Path) and _saved_to_disk(where):
            loaded = datasets.load_from_disk(str(where))
            if isinstance(loaded, datasets.DatasetDict):
                if split not in loaded:
                    raise HFDataError(f"data.split: {source} has no split {split!r} "
                                      f"(splits: {', '.join(sorted(loaded))})")
                loaded = loaded[split]
            return list(loaded.to_list())
        loaded = datasets.load_dataset(str(where), subset, split=split)
        return list(loaded.to_list())
    except HFDataError:
        raise
    except ValueError as exc:
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "split" in text.lower():
            raise HFDataError(f"data.split: {source}: {text}") from None
        if "config" in text.lower():
            raise HFDataError(f"data.subset: {source}: {text}") from None
        raise HFDataError(f"{field}: {source}: {text}") from None
    except (ConnectionError, FileNotFoundError) as exc:
        raise HFDataError(f"{field}: dataset {source!r} not found locally (datasets run offline: save it with "
                          f"save_to_disk, or load it once with network into the Hugging Face cache)") from exc
    except Exception as exc:  # noqa: BLE001 (datasets raises many types; one line for the user)
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise HFDataError(f"{field}: {source}: cannot read the dataset: {text}") from None


def fingerprint(source: str) -> str:
    """A hash of a dataset source's files (names, sizes and modification times: content-addressed
    caches of datasets hold hundreds of MB), for the tokenized-data cache key."""
    where = resolve(source)
    digest = hashlib.sha256(str(where).encode())
    if isinstance(where, Path):
        for file in sorted(p for p in where.rglob("*") if p.is_file()):
            stat = file.stat()
            digest.update(f"{file.relative_to(where)}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()
