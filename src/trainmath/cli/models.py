"""``trainmath models``: the bundled offline catalog, with where each config came from."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="list the bundled catalog of published configs (usable offline)",
                       description="List the offline catalog: real published config.json files with their source. "
                                   "Any of these names works as MODEL, also without the organisation, in any case.")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    p.add_argument("--sources", action="store_true", help="show where each config was copied from")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trainmath.render import table
    from trainmath.sources import catalog_entry, catalog_index

    entries = [catalog_entry(repo) for repo in catalog_index()]
    if args.json:
        print(json.dumps([{"model": e.name, "model_type": e.config.get("model_type"), "file": e.origin,
                           "source": e.provenance} for e in entries], indent=1))
        return 0
    rows = [[e.name, e.config.get("model_type", "?")] + ([e.provenance] if args.sources else [])
            for e in entries]
    headers = ["model", "model_type"] + (["source"] if args.sources else [])
    print(table(headers, rows, align="lll"))
    return 0
