"""Where a model's config comes from: a file, a directory, the bundled catalog, or the Hugging Face Hub.

This is an impure edge (it reads files and, for Hub ids, the network); the calculator itself only ever sees the
resulting dict. ``MODEL`` may be:

- a path to a ``config.json`` (any file name), or a directory holding ``config.json``;
- a catalog name: a Hub repo id (``Qwen/Qwen3-32B``) or, case-insensitively, its name without the organisation
  (``qwen3-32b``); ``trainmath models`` lists them;
- any other Hub repo id ``org/name``: its ``config.json`` is fetched with ``huggingface_hub`` when online.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cache

from trainmath.errors import TrainmathError
from trainmath.model.config import parse_config_text


CATALOG_DIR = os.path.join(os.path.dirname(__file__), "catalog")  # os.path: pathlib costs ~4 ms to import


@dataclass(frozen=True, kw_only=True)
class ModelSource:
    name: str
    """Display name: the repo id for catalog/Hub models, else the path."""
    config: dict[str, object]
    origin: str
    """Where the config was read from: a path, ``catalog:<file>`` with its _source, or ``hub:<repo id>``."""
    provenance: str = ""


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


@cache
def catalog_index() -> dict[str, str]:
    """Hub repo id → file name of the bundled config."""
    data = json.loads(_read(os.path.join(CATALOG_DIR, "index.json")))
    return data["models"]


def catalog_entry(repo_id: str) -> ModelSource:
    fname = catalog_index()[repo_id]
    config = parse_config_text(_read(os.path.join(CATALOG_DIR, fname)), f"catalog {fname}")
    return ModelSource(name=repo_id, config=config, origin=f"catalog:{fname}", provenance=str(config.get("_source", "")))


def find_in_catalog(model: str) -> str | None:
    """The catalog repo id ``model`` names (exact id, or case-insensitive name without organisation)."""
    index = catalog_index()
    if model in index:
        return model
    low = model.lower()
    for repo_id in index:
        if repo_id.lower() == low or repo_id.split("/", 1)[1].lower() == low:
            return repo_id
    return None


def resolve(model: str) -> ModelSource:
    """Find the config ``model`` names; one ``TrainmathError`` saying what to pass instead when none is found."""
    path = os.path.expanduser(model)
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
        if not os.path.isfile(path):
            raise TrainmathError(f"directory {model} holds no config.json")
    if os.path.isfile(path):
        try:
            text = _read(path)
        except (OSError, UnicodeDecodeError) as e:
            raise TrainmathError(f"cannot read {model}: {e}") from None
        return ModelSource(name=str(model), config=parse_config_text(text, str(model)), origin=path)
    repo_id = find_in_catalog(model)
    if repo_id is not None:
        return catalog_entry(repo_id)
    if model.count("/") == 1 and not model.startswith((".", "/")) and not model.endswith(".json"):
        return _from_hub(model)
    raise TrainmathError(f"{model!r} is not a file, a directory with config.json, a catalog model "
                         f"(see `trainmath models`) or a Hub repo id (org/name)")


def call_hub(function: str, hint: str, *args, **kwargs):
    """``huggingface_hub.<function>(*args, **kwargs)``, the one way trainmath reaches the Hub (imported here: the
    Hub is optional). Offline (HF_HUB_OFFLINE), not installed, or any failure (network, 404, gated repo) becomes
    one ``TrainmathError``: ``hint`` (what to pass instead) and the reason."""
    if os.environ.get("HF_HUB_OFFLINE") in ("1", "true", "True"):
        raise TrainmathError(hint + " (HF_HUB_OFFLINE is set)")
    try:
        import huggingface_hub
    except ImportError:
        raise TrainmathError(f"{hint} (or install huggingface_hub: pip install 'trainmath[hub]')") from None
    try:
        return getattr(huggingface_hub, function)(*args, **kwargs)
    except Exception as e:
        reason = str(e).splitlines()[0][:160] if str(e) else ""
        raise TrainmathError(f"{hint} ({type(e).__name__}: {reason})") from None


def _from_hub(repo_id: str) -> ModelSource:
    """Fetch ``config.json`` of a Hub repo."""
    local = call_hub("hf_hub_download", f"{repo_id!r} is not in the offline catalog and the Hugging Face Hub could "
                     f"not be reached; download its config.json and pass the file's path instead",
                     repo_id, "config.json", etag_timeout=5)
    return ModelSource(name=repo_id, config=parse_config_text(_read(local), repo_id),
                       origin=f"hub:{repo_id}")


def load_spec(model: str, *, strict: bool = False):
    """``resolve`` + ``spec_from_config``: the ``ModelSpec`` of whatever ``model`` names; ``strict`` refuses a
    config that lacks keys (transformers' defaults) or holds keys that look misspelt."""
    from trainmath.model import spec_from_config

    src = resolve(model)
    return spec_from_config(src.config, name=src.name, source=src.name, strict=strict)
