"""``trainmath serve [--port 8000] [--host 127.0.0.1]``: the local web calculator."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="a local web calculator over the same core (127.0.0.1 by default)",
                       description="Serve a page where you pick a catalog model or drop a config.json, set the "
                                   "training and serving setup, and see parameters, memory, KV cache and the fit "
                                   "update, with the report's charts and a link to the full report. Listens on "
                                   "127.0.0.1 (this machine only) unless --host says otherwise; keeps no state.")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0 picks a free one)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1; 0.0.0.0 exposes the calculator to your network)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trainmath.errors import TrainmathError
    from trainmath.serve.app import make_server

    if not 0 <= args.port <= 65535:
        raise TrainmathError(f"--port must be in 0..65535, got {args.port}")
    server = make_server(args.host, args.port)
    host, port = server.server_address[:2]
    print(f"trainmath serve: http://{host}:{port}/  (Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
