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
    return ModelSource(name=repo_id, config=config, origin=f"catalog:{fname}",
                       provenance=str(config.get("_source", "")))


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
    raise TrainmathError(f"{_quote(model)} is not a file, a directory with config.json, a catalog model "
                         f"(see `trainmath models`) or a Hub repo id (org/name){_did_you_mean(model)}")


def _quote(text: str) -> str:
    return repr(text) if len(text) <= 80 else repr(text[:60]) + f"... ({len(text):,} characters)"


def nearest_in_catalog(model: str, n: int = 3) -> list[str]:
    """Catalog repo ids closest to ``model`` (case-insensitive, with or without the organisation): names it
    begins, then the closest by difflib's ratio (``qwen3-8`` → Qwen/Qwen3-8B)."""
    import difflib

    low = model.lower().strip()[:200]
    by_name = {repo.split("/", 1)[1].lower(): repo for repo in catalog_index()}
    by_id = {repo.lower(): repo for repo in catalog_index()}
    prefix = sorted((r for key, r in {**by_name, **by_id}.items() if key.startswith(low) and low), key=len)
    close = [by_name.get(m) or by_id[m]
             for m in difflib.get_close_matches(low, [*by_name, *by_id], n=n, cutoff=0.6)]
    return list(dict.fromkeys(prefix + close))[:n]


def _did_you_mean(model: str) -> str:
    near = nearest_in_catalog(model)
    return f"; did you mean {', '.join(near)}?" if near else ""


# Seconds to wait for a TCP connection to the Hub before calling it unreachable: without a route (or DNS)
# huggingface_hub would retry five times over ~23 s.
HUB_CONNECT_TIMEOUT_S = 1.5


def hub_reachable(timeout_s: float = HUB_CONNECT_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the Hub's host (``HF_ENDPOINT``, default huggingface.co:443) opens within
    ``timeout_s``. Name resolution runs in a thread, since ``getaddrinfo`` has no timeout of its own."""
    import socket
    import threading
    from urllib.parse import urlsplit

    url = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    ok: list[bool] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
            ok.append(True)
        except OSError:
            pass

    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    thread.join(timeout_s)
    return bool(ok)


def _reason(e: Exception) -> str:
    """An exception as a short clause: its type and first sentence, cut at a word, never mid-word."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    text = text.split(". ", 1)[0]
    if len(text) > 160:
        text = text[:160].rsplit(" ", 1)[0] + " ..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def call_hub(function: str, hint: str, *args, **kwargs):
    """``huggingface_hub.<function>(*args, **kwargs)``, the one way trainmath reaches the Hub (imported here: the
    Hub is optional). Offline (HF_HUB_OFFLINE), not installed, or any failure (network, 404, gated repo) becomes
    one ``TrainmathError``: ``hint`` (what to pass instead) and the reason."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        raise TrainmathError(hint + " (HF_HUB_OFFLINE is set)")
    try:
        import huggingface_hub
    except ImportError:
        raise TrainmathError(f"{hint} (or install huggingface_hub: pip install 'trainmath[hub]')") from None
    if not hub_reachable():
        raise TrainmathError(f"{hint} (no connection to the Hub within {HUB_CONNECT_TIMEOUT_S:g} s: offline?)")
    try:
        return getattr(huggingface_hub, function)(*args, **kwargs)
    except Exception as e:
        raise TrainmathError(f"{hint} ({_reason(e)})") from None


def _from_hub(repo_id: str) -> ModelSource:
    """Fetch ``config.json`` of a Hub repo."""
    try:
        local = call_hub("hf_hub_download", f"{_quote(repo_id)} is not in the offline catalog and could not be "
                         f"fetched from the Hugging Face Hub", repo_id, "config.json", etag_timeout=5)
    except TrainmathError as e:
        raise TrainmathError(f"{e}; download its config.json and pass the file's path instead"
                             f"{_did_you_mean(repo_id)}") from None
    return ModelSource(name=repo_id, config=parse_config_text(_read(local), repo_id),
                       origin=f"hub:{repo_id}")


def load_spec(model: str, *, strict: bool = False):
    """``resolve`` + ``spec_from_config``: the ``ModelSpec`` of whatever ``model`` names; ``strict`` refuses a
    config that lacks keys (transformers' defaults) or holds keys that look misspelt."""
    from trainmath.families import spec_from_config

    src = resolve(model)
    return spec_from_config(src.config, name=src.name, source=src.name, strict=strict)
