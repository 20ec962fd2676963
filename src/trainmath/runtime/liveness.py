"""What keeps a launch honest when something outside it goes wrong: signals to the launcher, and nodes that vanish.

- SIGTERM, SIGHUP, SIGINT: while ranks run, the launcher's handlers raise ``Signalled``; ``launch`` forwards the
  signal to its ranks, stops them, removes their log folder and raises :class:`Interrupted`, one line with the
  shell's exit code (143, 129, 130).
- In a job of several launchers each one keeps a heartbeat in the job's store (:class:`Heartbeats`), so that the
  launchers that survive can say which node vanished, rather than blame a healthy local rank that merely lost
  its peers.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import signal
import time
from typing import TYPE_CHECKING

import torch.distributed as dist

from trainmath.errors import TrainmathError

if TYPE_CHECKING:
    from trainmath.runtime.job import JobSpec


class Interrupted(TrainmathError):
    """The launcher got SIGTERM, SIGHUP or SIGINT: it forwarded the signal to its ranks, stopped them and removed
    their logs. ``exit_code`` is the shell's 128 + signal number (143, 129, 130)."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


class Signalled(BaseException):
    """Raised in the launcher by its signal handler, so that ``launch``'s cleanup runs."""

    def __init__(self, signum: int):
        self.signum = signum


FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def install_handlers() -> dict | None:
    """Turn SIGTERM/SIGHUP/SIGINT into ``Signalled`` while ranks run; None off the main thread (where Python
    cannot set handlers; the caller's own handling applies there)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        raise Signalled(signum)

    return {sig: signal.signal(sig, handler) for sig in FORWARDED}


class Heartbeats:
    """Each launcher of a multi-node job bumps a counter in the job's store every ``period_s`` and watches the
    others' counters, so that a failed job can say which node vanished (its counter stopped) instead of blaming
    a healthy local rank that merely lost its peers.

    The store client runs in a forked helper process whose C++ log (c10d's reconnect warnings once the store
    is gone) goes to the rank log folder; it shares the last time each node's counter moved (CLOCK_MONOTONIC,
    the same in every process of the machine) through shared memory."""

    def __init__(self, spec: JobSpec, port: int, log_dir: str, period_s: float = 0.25):
        ctx = mp.get_context("fork")
        self.spec = spec
        self.last_change = ctx.Array("d", spec.nnodes, lock=False)  # 0.0: never seen
        self.store_lost_at = ctx.Value("d", 0.0, lock=False)
        self.leaving = ctx.Value("i", 0, lock=False)
        self._proc = ctx.Process(target=_heartbeat_main, name="heartbeat", daemon=True,
                                 args=(spec, port, period_s, self.last_change, self.store_lost_at, self.leaving,
                                       os.path.join(log_dir, "heartbeat.log")))
        self._proc.start()

    def stop(self) -> None:
        """Tell the other launchers this one leaves on purpose (its counter becomes "exit"), then stop."""
        self.leaving.value = 1
        self._proc.join(timeout=1)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(timeout=2)

    def vanished(self, silent_s: float = 1.0) -> list[int]:
        """Nodes whose heartbeat stopped: silent for ``silent_s`` while the store could still be read; node 0 too
        when the store it hosts went away while this launcher was reading it."""
        lost = self.store_lost_at.value or None
        until = lost if lost is not None else time.monotonic()
        gone = [k for k in range(self.spec.nnodes) if k != self.spec.node_rank and self.last_change[k] > 0
                and until - self.last_change[k] >= silent_s]  # 0: never seen; < 0: left on purpose
        if self.spec.node_rank != 0 and lost is not None and 0 not in gone:
            gone.insert(0, 0)
        return gone


def _heartbeat_main(spec: JobSpec, port: int, period_s: float, last_change, store_lost_at, leaving,
                    log_path: str) -> None:
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    for sig in FORWARDED:
        signal.signal(sig, signal.SIG_DFL)
    values: dict[int, str] = {}
    beat = 0
    store = None
    while True:
        try:
            if store is None:
                store = dist.TCPStore(spec.master_addr, port, is_master=False,
                                      timeout=datetime.timedelta(seconds=max(spec.timeout_s, 2.0)))
            beat += 1
            if leaving.value:
                store.set(f"trainmath/heartbeat/{spec.node_rank}", "exit")
                os._exit(0)
            store.set(f"trainmath/heartbeat/{spec.node_rank}", str(beat))
            now = time.monotonic()
            for k in range(spec.nnodes):
                key = f"trainmath/heartbeat/{k}"
                if k != spec.node_rank and store.check([key]):
                    value = store.get(key).decode()
                    if value == "exit":
                        last_change[k] = -1.0
                    elif values.get(k) != value:
                        values[k], last_change[k] = value, now
        except Exception:  # noqa: BLE001 - the store is gone: say when, and stop
            if store is not None:
                store_lost_at.value = time.monotonic()
            os._exit(0)
        time.sleep(period_s)


def vanished_message(spec: JobSpec, nodes: list[int], local: list[int]) -> str:
    parts = []
    for k in nodes:
        first = k * spec.nproc_per_node
        ranks = ", ".join(map(str, range(first, first + spec.nproc_per_node)))
        host = " (hosting the rendezvous store)" if k == 0 else ""
        parts.append(f"node {k}{host} with ranks {ranks}")
    return (f"{'; '.join(parts)} vanished: its launcher stopped answering (killed, or its machine or network went "
            f"down); the ranks on this node ({', '.join(map(str, local))}) then lost their peers")
