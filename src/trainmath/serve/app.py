"""Requests to responses for ``trainmath serve``, and the HTTP server around them (standard library only).

Routes: ``GET /`` the page; ``POST /api/calc`` (form-encoded fields) → JSON with the numbers and the charts'
SVG, or ``{"ok": false, "error": "trainmath: error: ..."}`` — the line the CLI would print; ``GET|POST /report``
the HTML report of the same fields. The fields are the flags of ``trainmath report`` (``micro-batch``, ``seq``,
``zero``, ``gpu``, ``gpus``, ...), plus ``model`` (a catalog name) or ``config`` (the text of a config.json).
"""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from trainmath.errors import TrainmathError
from trainmath.serve.flags import parser

MAX_BODY_BYTES = 1 << 20
"""Largest request body accepted (a config.json is a few KiB; the largest in the catalog is under 64 KiB)."""


def _argv(fields: dict[str, str]) -> list[str]:
    """Form fields → command-line flags; an unknown field is an error naming it."""
    known = {a.option_strings[0][2:]: a for a in parser()._actions if a.option_strings}
    argv = []
    for name, value in fields.items():
        if name in ("model", "config", "config_name"):
            continue
        action = known.get(name)
        if action is None:
            raise TrainmathError(f"unknown field {name!r}; known: model, config, {', '.join(sorted(known))}")
        if action.nargs == 0:  # a checkbox: present means on
            if value not in ("", "off", "false", "0"):
                argv.append(f"--{name}")
        elif value != "":
            argv += [f"--{name}", value]
    return argv


def _spec(fields: dict[str, str]):
    from trainmath.families import spec_from_config
    from trainmath.model.config import parse_config_text
    from trainmath.sources import catalog_entry, find_in_catalog

    text = fields.get("config", "").strip()
    if text:
        name = fields.get("config_name") or "dropped config.json"
        return spec_from_config(parse_config_text(text, name), name=name, source=name)
    model = fields.get("model", "")
    repo = find_in_catalog(model) if model else None
    if repo is None:  # never a path on the server, never the network
        raise TrainmathError(f"model {model!r} is not in the catalog; pick one or drop a config.json")
    src = catalog_entry(repo)
    return spec_from_config(src.config, name=src.name, source=src.name)


def compute(fields: dict[str, str]):
    """ReportData for the form's fields: the same parsing and checks as ``trainmath report``."""
    from trainmath.adapters import peft_from_args
    from trainmath.args import positions_warning
    from trainmath.report.gather import gather
    from trainmath.report.options import plan_from_args, serving_from_args, training_from_args

    args = parser().parse_args(_argv(fields))
    peft = peft_from_args(args)
    setup, layout, gpu = training_from_args(args)
    serving = serving_from_args(args)
    spec = _spec(fields)
    positions_warning(spec, setup.seq, "seq")  # learned positions (GPT-2): no row beyond them
    return gather(spec, setup, layout, gpu=gpu, serving=serving, plan=plan_from_args(args, spec, setup, gpu),
                  mem_util_percent=args.mem_util, serve_output=args.serve_output, peft=peft,
                  **({} if args.host_memory is None else {"host_memory_bytes": args.host_memory}))


def calc(fields: dict[str, str]) -> dict:
    """The JSON the page shows: numbers (exact integers), the memory table, the charts' SVG, and with a GPU count
    the planner's best layouts (``plan``: as ``trainmath plan --json``'s ``layouts``; ``plan_html``: the report's
    table of them)."""
    from trainmath.plot.svg import chart_svg
    from trainmath.render import human_bytes
    from trainmath.report.gather import charts, summary
    from trainmath.report.html import plan_html

    try:
        data = compute(fields)
    except TrainmathError as e:
        return {"ok": False, "error": f"trainmath: error: {e}"}
    peak = data.memory.peak_bytes
    return {"ok": True, "summary": summary(data),
            "memory_rows": [[n.name, f"{n.value:,}", human_bytes(n.value), f"{100 * n.value / peak:.1f}%"]
                            for n in data.memory.breakdown.children if n.value],
            "charts": {k: chart_svg(c, chart_id=f"chart-{k}") for k, c in charts(data).items()},
            "plan": None if data.plan is None else [e.to_dict() for e in data.plan.layouts],
            "plan_html": plan_html(data.plan)}


def report(fields: dict[str, str]) -> tuple[int, str]:
    from trainmath.report.html import page

    try:
        return 200, page(compute(fields))
    except TrainmathError as e:
        from html import escape

        return 400, f"<!DOCTYPE html><meta charset=utf-8><title>error</title><p>trainmath: error: {escape(str(e))}</p>"


MAX_FIELDS = 200
"""Most form fields in one request (the form has about 40)."""


def _fields(query: str) -> dict[str, str]:
    """Form-encoded text → field → value (the last value of a repeated field)."""
    try:
        return {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True, max_num_fields=MAX_FIELDS).items()}
    except ValueError:  # parse_qs' own refusal of too many fields
        raise TrainmathError(f"a request may hold at most {MAX_FIELDS} form fields") from None


class Handler(BaseHTTPRequestHandler):
    server_version = "trainmath"
    timeout = 15  # seconds a client may take to send its request: a stalled client does not hold a thread

    def log_message(self, fmt, *args) -> None:  # one quiet line per request on stderr
        # A request line that could not be parsed leaves command and path unset (or path 70 KB long).
        command = getattr(self, "command", None) or "-"
        path = urlsplit(getattr(self, "path", "") or "").path
        path = path if len(path) <= 200 else path[:200] + "..."
        status = args[1] if len(args) > 1 and fmt.startswith('"%s"') else (fmt % args if args else fmt)
        sys.stderr.write(f"trainmath serve: {command} {path} {status}\n")

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's errors (400 bad request line, 414 URI too long, 431 headers, 501 method, 505 version)
        as one line: ``trainmath: error: ...`` text, or JSON ``{"ok": false, "error": ...}`` under /api/."""
        text = message or self.responses.get(code, ("error",))[0]
        self.close_connection = True
        if getattr(self, "request_version", None) not in ("HTTP/1.0", "HTTP/1.1"):
            self.request_version = "HTTP/1.0"  # a bad request line: still answer with a status line
        try:
            self._error(code, f"{code} {text}")
        except OSError:
            pass

    def _error(self, status: int, text: str) -> None:
        """One line ``trainmath: error: TEXT``: JSON ``{"ok": false, "error": ...}`` under /api/, else text."""
        line = f"trainmath: error: {text}"
        if (getattr(self, "path", "") or "").startswith("/api/"):
            return self._send(status, "application/json", json.dumps({"ok": False, "error": line}))
        return self._send(status, "text/plain", line + "\n")

    def _send(self, status: int, ctype: str, body: str) -> None:
        data = body.encode("utf-8")
        if not hasattr(self, "command"):  # an unparsed request line: answer in HTTP/1.0
            self.command, self.request_version = None, "HTTP/1.0"
        self.send_response(status)
        self.send_header("Content-Type", f"{ctype}; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; "
                         "style-src 'unsafe-inline'; img-src data:; connect-src 'self'; form-action 'self'")
        if status >= 400:
            self.send_header("Connection", "close")
        self.end_headers()
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client left before its answer: nothing to tell
            self.close_connection = True

    def _body(self) -> str | None:
        try:
            n = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            n = -1
        if not 0 <= n <= MAX_BODY_BYTES:
            self._error(413, f"request body must be a Content-Length of at most {MAX_BODY_BYTES} bytes")
            return None
        try:
            raw = self.rfile.read(n)
        except (OSError, TimeoutError):
            raw = b""
        if len(raw) < n:  # the client hung up (or stalled) mid-body: never compute on a truncated request
            self.close_connection = True
            sys.stderr.write(f"trainmath serve: POST {urlsplit(self.path).path}: client sent {len(raw)} of {n} "
                             f"body bytes and stopped; not processed\n")
            return None
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self._error(400, "request body is not UTF-8")
            return None

    def _route(self, fields: dict[str, str] | None) -> None:
        path = urlsplit(self.path).path
        if path == "/" and self.command == "GET":
            from trainmath.serve.page import page

            return self._send(200, "text/html", page())
        if path == "/api/calc" and self.command == "POST":
            return self._send(200, "application/json", json.dumps(calc(fields or {})))
        if path == "/report":
            status, html = report(fields or {})
            return self._send(status, "text/html", html)
        return self._error(404, f"no page {path[:200]}")

    def _safely(self, query: str) -> None:
        try:
            fields = _fields(query)
        except TrainmathError as e:
            return self._error(400, str(e))
        try:
            self._route(fields)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as e:  # a bug must not show a stack trace in the page: one line, here and on stderr
            sys.stderr.write(f"trainmath serve: internal error: {type(e).__name__}: {e}\n")
            self._send(500, "text/plain", f"trainmath: internal error ({type(e).__name__}); see the server log")

    def do_GET(self) -> None:
        self._safely(urlsplit(self.path).query)

    def do_POST(self) -> None:
        body = self._body()
        if body is not None:
            self._safely(body)


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        """One line for a connection that failed outside a handler (socketserver prints a traceback)."""
        e = sys.exc_info()[1]
        if not isinstance(e, (BrokenPipeError, ConnectionResetError, TimeoutError)):
            sys.stderr.write(f"trainmath serve: connection from {client_address[0]} failed: "
                             f"{type(e).__name__}: {e}\n")


def make_server(host: str = "127.0.0.1", port: int = 8000) -> ThreadingHTTPServer:
    """A server bound to ``host:port`` (port 0: a free one; read ``server.server_address``)."""
    try:
        server = Server((host, port), Handler)
    except OSError as e:
        raise TrainmathError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    server.daemon_threads = True
    return server
