"""Start N ranks the way torchrun does, watch them, and fail fast naming the rank that died or stalled.

The launcher is the only code that reads RANK / WORLD_SIZE: it sets torchrun's variables (MASTER_ADDR,
MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK) in each worker, and the worker's
bootstrap turns them into a :class:`RankContext` that is passed explicitly to the function it runs.

Workers are forked after torch is imported (about 0.1 s, against 4-8 s for torchrun or spawn on a small CPU
machine). The node-0 launcher hosts the rendezvous store itself, as torchrun's agent does, so a port already
in use is reported before any worker starts, and ``master_port=0`` picks a free port. Several launchers with
``node_rank`` 0..nnodes-1 pointing at the same master form one job, on one machine over loopback or across
machines: the same command scales past one machine.

Faults: each worker reports success or its exception through a pipe. When a worker exits without reporting,
the others are stopped and the error says ``rank K exited with code C``; when the others time out waiting
(the process group's ``timeout``) while a worker is still alive, it says ``rank K stalled``. Nothing hangs:
every collective has the process-group timeout and the whole job an optional deadline.
"""

from __future__ import annotations

import datetime
import errno
import faulthandler
import multiprocessing as mp
import multiprocessing.connection
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

from trainmath.errors import TrainmathError

try:
    import torch
    import torch.distributed as dist
except ImportError:  # the calculator installs without torch; every runtime command comes through here
    raise TrainmathError('this command needs torch: pip install "trainmath[runtime]"') from None

from trainmath.runtime import dtensor_state  # noqa: E402
from trainmath.runtime.job import BACKENDS, JobSpec  # noqa: E402, F401  (the launcher's vocabulary, re-exported)
from trainmath.runtime.liveness import (  # noqa: E402 - after the torch check
    FORWARDED,
    Heartbeats,
    Interrupted,
    Signalled,
    install_handlers,
    vanished_message,
)

# How long the launcher waits for the other ranks' reports once one rank has failed, before calling the
# ranks still running "stalled".
_GRACE_S = 2.0


@dataclass(frozen=True, kw_only=True)
class RankContext:
    """What a worker knows about its place in the job; handed explicitly to the function it runs."""

    rank: int
    """Global rank."""
    world_size: int
    """Number of ranks in the job (nnodes · nproc_per_node)."""
    local_rank: int
    """Rank on this node; also the local GPU index under NCCL."""
    local_world_size: int
    """Ranks per node."""
    node_rank: int
    """This node's index (torchrun's GROUP_RANK)."""
    master_addr: str
    master_port: int
    backend: str
    timeout_s: float
    """Process-group timeout: a collective waiting longer than this raises."""

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", self.local_rank) if self.backend == "nccl" else torch.device("cpu")

    @property
    def group(self) -> dist.ProcessGroup:
        """The default (world) process group."""
        return dist.group.WORLD


def _is_collateral(exc: BaseException) -> bool:
    """True for errors a rank gets because another rank died or stalled (connection lost, timeout)."""
    text = str(exc)
    needles = ("Connection closed by peer", "Connection reset by peer", "Timed out", "timed out", "timeout",
               "Pair is not connected", "Broken pipe", "pair closure", "closed")
    return isinstance(exc, dist.DistError) or any(s in text for s in needles)


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    # gloo prefixes messages with its source location: "[/path/pair.cc:553] Connection closed by peer ..."
    if line.startswith("[") and "] " in line:
        line = line.split("] ", 1)[1]
    # ... and appends advice that does not apply here ("This is typically caused by ...").
    line = line.split(". This is typically", 1)[0]
    return line[:300]


def _worker_main(env: dict[str, str], fn: Callable[..., Any], args: tuple, conn, listen_fd: int | None,
                 log_path: str) -> None:
    """Forked worker: torchrun-style env -> RankContext -> init_process_group -> fn(ctx, *args) -> report."""
    for sig in FORWARDED:  # the launcher's handlers are not the worker's: a forwarded signal ends it
        signal.signal(sig, signal.SIG_DFL)
    # C++ (gloo, c10d) logs go to a per-rank file the launcher shows only when asked; the result goes by pipe.
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    sys.stdout = sys.stderr = open(log_fd, "w", buffering=1, closefd=False)
    # The launcher sends SIGUSR1 to a stalled rank before stopping it: its Python stack lands in the log.
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    os.environ.update(env)
    # As torchrun does with several processes per node: one intra-op thread each, so that ranks sharing a few
    # cores do not oversubscribe them (here 4 ranks x 2 OpenMP threads on 2 cores made adds 20x slower).
    torch.set_num_threads(int(env.get("OMP_NUM_THREADS", "1")))
    # The launcher's side of the torchrun contract: only here are these variables read.
    ctx = RankContext(
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        local_rank=int(os.environ["LOCAL_RANK"]),
        local_world_size=int(os.environ["LOCAL_WORLD_SIZE"]),
        node_rank=int(os.environ["GROUP_RANK"]),
        master_addr=os.environ["MASTER_ADDR"],
        master_port=int(os.environ["MASTER_PORT"]),
        backend=os.environ["TRAINMATH_BACKEND"],
        timeout_s=float(os.environ["TRAINMATH_TIMEOUT_S"]),
    )
    code = 0
    try:
        timeout = datetime.timedelta(seconds=ctx.timeout_s)
        try:
            if listen_fd is not None:  # global rank 0 serves the store on the socket the launcher bound
                store = dist.TCPStore(ctx.master_addr, ctx.master_port, ctx.world_size, is_master=True,
                                      timeout=timeout, wait_for_workers=False, master_listen_fd=listen_fd)
            else:
                store = dist.TCPStore(ctx.master_addr, ctx.master_port, ctx.world_size, is_master=False,
                                      timeout=timeout)
        except Exception as e:  # noqa: BLE001 - turned into one line
            raise TrainmathError(
                f"could not reach the master at {ctx.master_addr}:{ctx.master_port} within {ctx.timeout_s:g} s "
                f"(is the node-rank-0 launcher running?)"
            ) from e
        kwargs = {}
        if ctx.backend == "nccl":
            if torch.cuda.device_count() <= ctx.local_rank:
                raise TrainmathError(
                    f"nccl needs one GPU per local rank: local rank {ctx.local_rank} but "
                    f"{torch.cuda.device_count()} GPU(s) visible; use --backend gloo"
                )
            torch.cuda.set_device(ctx.local_rank)
            kwargs["device_id"] = ctx.device
        dtensor_state.forget()  # a cache forked from a parent's fake process group names another rank
        dist.init_process_group(ctx.backend, store=store, rank=ctx.rank, world_size=ctx.world_size,
                                timeout=timeout, **kwargs)
        result = fn(ctx, *args)
        conn.send(("ok", result))
        _teardown()
    except BaseException as e:  # noqa: BLE001 - reported to the launcher, which names the rank
        traceback.print_exc()
        user = isinstance(e, TrainmathError)
        kind = "user" if user else ("collateral" if _is_collateral(e) else "error")
        message = str(e) if user else f"{type(e).__name__}: {_first_line(str(e))}"
        try:
            conn.send((kind, message))
        except Exception:  # noqa: BLE001 - the launcher may be gone
            pass
        code = 1
    finally:
        sys.stdout.flush()
        conn.close()
    if code and listen_fd is not None and ctx.world_size > ctx.local_world_size:
        # The store lives in this process: keep it up through the launchers' grace period, so that each can still
        # read the others' heartbeats and name a node that vanished (the launcher stops this rank after it).
        time.sleep(_GRACE_S + 1.0)
    os._exit(code)


def _listen(spec: JobSpec) -> socket.socket:
    """Bind and listen on the master address and port (0: a free one), IPv4; rank 0's store serves on it.

    Binding here, before any worker starts, makes "port in use" exact and early. Handing rank 0 this IPv4
    socket (``master_listen_fd``) also keeps peer addresses plain IPv4: on a dual-stack socket they are
    ``::ffff:127.0.0.1``, which the store's logging reverse-resolves through DNS, and on a host without DNS
    that stalled the store for 5 s about one launch in twenty.
    """
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((spec.master_addr, spec.master_port))
        s.listen(128)
    except OSError as e:
        s.close()
        if e.errno == errno.EADDRINUSE:
            raise TrainmathError(_in_use(spec.master_addr, spec.master_port)) from None
        raise TrainmathError(f"cannot listen on {spec.master_addr}:{spec.master_port}: {e.strerror}") from None
    return s


def _in_use(addr: str, port: int) -> str:
    return f"port {port} on {addr} is already in use; choose another --master-port (0 picks a free one)"


def launch(spec: JobSpec, fn: Callable[..., Any], *args: Any, keep_logs: bool = False) -> dict[int, Any]:
    """Run ``fn(ctx, *args)`` on this node's ranks; return ``{global rank: result}`` for them.

    The result travels back through a pipe, so it must pickle. Raises :class:`TrainmathError` with one line
    naming the failing rank.
    """
    listener = _listen(spec) if spec.node_rank == 0 else None
    port = listener.getsockname()[1] if listener is not None else spec.master_port
    log_dir = tempfile.mkdtemp(prefix="trainmath-ranks-")
    ctx = mp.get_context("fork")
    procs: dict[int, mp.Process] = {}
    conns: dict[int, Any] = {}
    first = spec.node_rank * spec.nproc_per_node
    failed = True
    signalled: int | None = None
    beats: Heartbeats | None = None
    previous = install_handlers()
    try:
        for local in range(spec.nproc_per_node):
            rank = first + local
            env = {
                "MASTER_ADDR": spec.master_addr, "MASTER_PORT": str(port), "RANK": str(rank),
                "WORLD_SIZE": str(spec.world_size), "LOCAL_RANK": str(local),
                "LOCAL_WORLD_SIZE": str(spec.nproc_per_node), "GROUP_RANK": str(spec.node_rank),
                "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
                "TRAINMATH_BACKEND": spec.backend, "TRAINMATH_TIMEOUT_S": repr(spec.timeout_s),
            }
            listen_fd = listener.fileno() if (listener is not None and rank == 0) else None
            recv_end, send_end = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_worker_main, name=f"rank{rank}",
                            args=(env, fn, args, send_end, listen_fd, os.path.join(log_dir, f"rank{rank}.log")),
                            daemon=True)
            p.start()
            send_end.close()
            procs[rank], conns[rank] = p, recv_end
        if listener is not None:
            listener.close()  # rank 0 owns its forked copy now
            listener = None
        if spec.nnodes > 1:
            beats = Heartbeats(spec, port, log_dir)
        results = _watch(spec, procs, conns, log_dir, beats)
        failed = False
        return results
    except Signalled as e:
        signalled = e.signum
    finally:
        if beats is not None:
            beats.stop()
        try:
            _stop(procs, failed, keep_logs, signalled)
        except Signalled as e:  # a second signal during cleanup: finish cleaning up all the same
            signalled = e.signum
            _stop(procs, failed, False, signalled)
        if failed and keep_logs and signalled is None:
            print(f"trainmath: rank logs kept in {log_dir}", file=sys.stderr)
        else:
            shutil.rmtree(log_dir, ignore_errors=True)
        if listener is not None:
            listener.close()
        if previous is not None:
            for sig, old in previous.items():
                signal.signal(sig, old)
    name = signal.Signals(signalled).name
    ranks = ", ".join(map(str, sorted(procs))) or "none started"
    raise Interrupted(f"stopped by {name}: forwarded to ranks {ranks} on this node, which are stopped; their "
                      f"logs are removed", signalled)


def _stop(procs: dict[int, mp.Process], failed: bool, keep_logs: bool, signalled: int | None) -> None:
    """End every worker still running: the launcher's signal forwarded (else SIGTERM), SIGKILL after 5 s."""
    alive = [p for p in procs.values() if p.is_alive()]
    if alive and failed and keep_logs and signalled is None:
        for p in alive:
            os.kill(p.pid, signal.SIGUSR1)
        time.sleep(0.2)
    for p in alive:
        try:
            os.kill(p.pid, signalled or signal.SIGTERM)
        except ProcessLookupError:
            pass
    for p in procs.values():
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join()


def _watch(spec: JobSpec, procs: dict[int, mp.Process], conns: dict[int, Any], log_dir: str,
           beats: Heartbeats | None = None) -> dict[int, Any]:
    start = time.monotonic()
    reports: dict[int, tuple[str, Any]] = {}
    exited: dict[int, int] = {}
    first_failure: float | None = None
    pending_conns = dict(conns)
    while True:
        now = time.monotonic()
        alive = [r for r in procs if r not in exited]
        if not alive:
            break
        if first_failure is not None and now - first_failure > _GRACE_S:
            break
        if spec.deadline_s is not None and now - start > spec.deadline_s:
            break
        waitables = list(pending_conns.values()) + [procs[r].sentinel for r in alive]
        limit = 0.2 if first_failure is not None else 1.0
        for ready in multiprocessing.connection.wait(waitables, timeout=limit):
            for rank, c in list(pending_conns.items()):
                if c is ready:
                    try:
                        reports[rank] = c.recv()
                    except (EOFError, OSError):
                        pass
                    del pending_conns[rank]
        for rank in alive:
            if not procs[rank].is_alive():
                procs[rank].join()
                # A report can arrive just before the exit is seen; drain it.
                c = pending_conns.pop(rank, None)
                if c is not None and c.poll():
                    try:
                        reports[rank] = c.recv()
                    except (EOFError, OSError):
                        pass
                exited[rank] = procs[rank].exitcode
        bad = [r for r, (k, _) in reports.items() if k != "ok"] + [r for r, c in exited.items() if c != 0]
        if bad and first_failure is None:
            first_failure = time.monotonic()
    if all(reports.get(r, ("",))[0] == "ok" for r in procs):
        return {r: reports[r][1] for r in sorted(procs)}
    if beats is not None:
        # a node that vanished explains local ranks that lost their peers or stalled (but not one that died or
        # raised on its own)
        local_fault = [r for r in procs if (r in exited and exited[r] != 0 and r not in reports)
                       or reports.get(r, ("",))[0] in ("user", "error")]
        gone = beats.vanished()
        if gone and not local_fault:
            raise TrainmathError(vanished_message(spec, gone, sorted(procs)))
    raise TrainmathError(_diagnose(spec, procs, reports, exited, time.monotonic() - start, log_dir))


def _diagnose(spec, procs, reports, exited, elapsed_s, log_dir) -> str:
    """One line naming the rank at fault: died > raised > stalled > lost its peers."""
    died = [r for r in sorted(procs) if r in exited and exited[r] != 0 and r not in reports]
    user = [r for r in sorted(procs) if reports.get(r, ("",))[0] == "user"]
    raised = [r for r in sorted(procs) if reports.get(r, ("",))[0] == "error"]
    collateral = [r for r in sorted(procs) if reports.get(r, ("",))[0] == "collateral"]
    silent = [r for r in sorted(procs) if r not in reports and r not in exited]
    if user:
        return f"rank {user[0]}: {reports[user[0]][1]}"
    if died:
        parts = [f"rank {r} exited with code {exited[r]}" for r in died]
        return "; ".join(parts) + _others(collateral, reports)
    if raised:
        return f"rank {raised[0]} failed: {reports[raised[0]][1]}" + _others(collateral, reports)
    if silent:
        ranks = ", ".join(map(str, silent))
        if collateral:
            return (f"rank {ranks} stalled: no result while the others timed out after {spec.timeout_s:g} s"
                    + _others(collateral, reports))
        return f"rank {ranks} stalled: no result within the {elapsed_s:.0f} s deadline"
    if collateral:
        r = collateral[0]
        where = "" if spec.nnodes == 1 else " (a rank on another node may have failed)"
        return f"rank {r} lost its peers{where}: {reports[r][1]}"
    return "the job failed without a report from any rank"


def _others(collateral: list[int], reports) -> str:
    if not collateral:
        return ""
    ranks = ", ".join(map(str, collateral))
    return f" (rank{'s' if len(collateral) > 1 else ''} {ranks} then failed: {reports[collateral[0]][1]})"


_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def run_under_torchrun(fn: Callable[..., Any], *args: Any, backend: str = "gloo", timeout_s: float = 30.0):
    """Run ``fn(ctx, *args)`` as this process's rank of a job started by torchrun (``python -m
    torch.distributed.run``): torchrun's variables become the :class:`RankContext`, the process group is
    initialised from them (``env://``) and destroyed afterwards. Returns ``(ctx, result)``.

    The second way into the runtime beside :func:`launch`; like it, the only code that reads RANK/WORLD_SIZE.
    """
    missing = [k for k in _TORCHRUN_VARS if k not in os.environ]
    if missing:
        raise TrainmathError(f"not started by torchrun ({', '.join(missing)} not set): run it as `python -m "
                             f"torch.distributed.run --nproc_per_node N -m MODULE ...`, or use `trainmath comm`")
    if backend not in BACKENDS:
        raise TrainmathError(f"unknown backend {backend!r}; choose gloo or nccl")
    world = int(os.environ["WORLD_SIZE"])
    ctx = RankContext(rank=int(os.environ["RANK"]), world_size=world, local_rank=int(os.environ["LOCAL_RANK"]),
                      local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", world)),
                      node_rank=int(os.environ.get("GROUP_RANK", "0")), master_addr=os.environ["MASTER_ADDR"],
                      master_port=int(os.environ["MASTER_PORT"]), backend=backend, timeout_s=timeout_s)
    kwargs = {}
    if backend == "nccl":
        torch.cuda.set_device(ctx.local_rank)
        kwargs["device_id"] = ctx.device
    dist.init_process_group(backend, init_method="env://", rank=ctx.rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s), **kwargs)
    try:
        result = fn(ctx, *args)
    except BaseException:
        dist.destroy_process_group()  # no barrier: a peer may be gone
        raise
    _teardown()
    return ctx, result


def _teardown() -> None:
    """After a rank's work succeeded: wait for every rank (gloo's barrier also waits for this rank's pending
    work), then destroy the process group, so that no rank closes its connections while a slower peer still
    reads from them (a gloo pair that loses its peer mid-read raises in gloo's own thread, which aborts)."""
    dist.barrier()
    dist.destroy_process_group()
