"""Whether a hub id can be loaded on this machine: from the Hugging Face cache, or downloaded.

vLLM and the trainer load a hub id through huggingface_hub, from its cache when the model
is there and from the hub otherwise. `hub_model_problem` says beforehand when neither can
work, so that `workbench up` refuses the recipe instead of starting a supervisor whose
processes fail one after the other. A cached model costs no network at all; only a model
that is not cached is asked about on the hub, with a short timeout, and not even that
under `HF_HUB_OFFLINE`. The settings are huggingface_hub's own (`HF_HUB_CACHE`,
`HF_HUB_OFFLINE`, `HF_ENDPOINT`), read as the processes that load the model read them.
"""

from __future__ import annotations

import re

# `org/name` or `name`: what huggingface_hub accepts as a model id.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
# A hub that answers does so in well under this; a machine without a route fails at once.
PROBE_TIMEOUT_S = 5.0


def looks_like_hub_id(base: str) -> bool:
    return bool(_HUB_ID.match(base)) and ".." not in base


def is_cached(repo_id: str) -> bool:
    """Whether the model's config.json is in the Hugging Face cache (no network)."""
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def hub_model_problem(repo_id: str) -> str | None:
    """None if `repo_id` is cached or can be downloaded now, else why it cannot be loaded."""
    if is_cached(repo_id):
        return None
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    where = f"not in the Hugging Face cache ({constants.HF_HUB_CACHE})"
    instead = (
        f"download it where the hub is reachable (`hf download {repo_id}`, then copy the "
        "cache) or name a local model directory"
    )
    if constants.HF_HUB_OFFLINE:
        return (
            f"{repo_id!r} is {where} and HF_HUB_OFFLINE is set, so it cannot be "
            f"downloaded: {instead}"
        )
    try:
        get_hf_file_metadata(hf_hub_url(repo_id, "config.json"), timeout=PROBE_TIMEOUT_S)
    except GatedRepoError:
        return (
            f"{repo_id!r} is {where} and gated on the hub: accept its terms on "
            f"{constants.ENDPOINT}/{repo_id} and log in (`hf auth login`)"
        )
    except RepositoryNotFoundError:
        return (
            f"{repo_id!r} is {where} and the hub ({constants.ENDPOINT}) has no such model "
            "(or it is private: log in with `hf auth login`); check the id"
        )
    except Exception as err:  # no route, no DNS, a proxy, a timeout: the hub is out of reach
        return (
            f"{repo_id!r} is {where} and the hub cannot be reached ({constants.ENDPOINT}: "
            f"{type(err).__name__}: {err}), so it cannot be downloaded: {instead}"
        )
    return None
