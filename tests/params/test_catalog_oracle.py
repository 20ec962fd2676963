"""Every catalog model: our ledger equals transformers' meta-device model exactly (total, activated, components)."""

import json
import pathlib

import pytest

from trainmath.families import spec_from_config
from trainmath.params import count_params
from trainmath.sources import catalog_entry, catalog_index

from .reference import meta_model, reference_counts

CATALOG = sorted(catalog_index())


@pytest.mark.parametrize("repo_id", CATALOG)
def test_catalog_model_matches_transformers(repo_id):
    src = catalog_entry(repo_id)
    report = count_params(spec_from_config(src.config, name=repo_id, source=repo_id))
    total, comps, activated = reference_counts(meta_model(src.config))
    assert report.total_params == total
    assert report.activated_params == activated
    ours = {k: v for k, v in report.components.flat().items() if v}
    assert ours == comps


def test_catalog_is_the_shared_one():
    shared = pathlib.Path(__file__).resolve().parents[3] / "shared" / "catalog"
    if not shared.is_dir():
        pytest.skip("../shared/catalog not present")
    files = {p.name for p in shared.glob("*.json")}
    assert set(catalog_index().values()) == files
    for repo_id in CATALOG:
        src = catalog_entry(repo_id)
        assert src.provenance, repo_id  # every entry says where it came from
        assert src.config == json.loads((shared / src.origin.split(":", 1)[1]).read_text().replace("Infinity", "1e999"))
