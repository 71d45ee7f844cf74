"""Whether a Hugging Face hub model can be had here: in the local cache, or on a hub that answers now.

One request, no retries, a short timeout: without a network the answer comes at once instead of the
hub client's minute of retries. The pre-flight of a run and ``ftui estimate`` both ask it.
"""

from __future__ import annotations

HUB_TIMEOUT_S = 10.0
"""How long the pre-flight waits for the Hugging Face hub to say whether a model id exists."""


def in_cache(name: str, revision: str | None = None) -> bool:
    """Whether the local Hugging Face cache holds ``name``'s config.json (no network, no transformers)."""
    import huggingface_hub  # deferred: only a hub model id needs it

    try:
        return isinstance(huggingface_hub.try_to_load_from_cache(name, "config.json", revision=revision), str)
    except ValueError:  # not the shape of a repository id
        return False


def hub_model_problem(name: str, revision: str | None = None) -> str | None:
    """Why the ranks could not load the hub model ``name`` (None: it is in the local Hugging Face cache, or
    the hub has it). Offline (``HF_HUB_OFFLINE``) or with the hub unreachable, only the cache counts."""
    import huggingface_hub  # deferred: only a recipe naming a hub model needs it
    from huggingface_hub import constants
    from huggingface_hub.errors import HfHubHTTPError

    try:
        cached = huggingface_hub.try_to_load_from_cache(name, "config.json", revision=revision)
    except ValueError:  # not the shape of a repository id
        return "neither a local model folder nor a Hugging Face model id"
    if isinstance(cached, str):
        return None
    if constants.HF_HUB_OFFLINE:
        return "not in the Hugging Face cache and HF_HUB_OFFLINE is set (download it first: hf download NAME)"
    try:
        huggingface_hub.HfApi().model_info(name, revision=revision, timeout=HUB_TIMEOUT_S)
    except HfHubHTTPError as exc:
        return f"the Hugging Face hub has no such model{' revision' if revision else ''} ({type(exc).__name__})"
    except Exception as exc:  # noqa: BLE001 (no network: DNS, connection, timeout)
        return f"not in the Hugging Face cache and the hub cannot be reached ({type(exc).__name__})"
    return None
