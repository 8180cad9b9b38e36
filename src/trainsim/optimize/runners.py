"""Evaluate many jobs: in this process, in a pool of local worker processes, or on a Ray cluster.

A `Runner` is made once and used for many batches (a strategy search asks for a few jobs at a time), so its
worker pool starts once. Every way returns the same rows (`evaluate.evaluate`) in the jobs' order.
`run_with_store` adds the results store: jobs already in it are not evaluated again, new rows are written
as they finish.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from .evaluate import evaluate, job_key

if TYPE_CHECKING:
    from .store import ResultsStore

Progress = Callable[[int, int], None]
"""progress(done, total): called after each job finishes."""

RAY_INSTALL = "pip install 'trainsim[ray]'"
RESUME_FIX = "with --db, the jobs that finished are kept: rerun to continue"


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:200] if text else type(exc).__name__


def _init_worker(parent: int) -> None:
    """Worker initializer: Ctrl-C reaches the whole process group, but the parent alone handles it (and ends
    the pool), so a worker never prints a KeyboardInterrupt traceback; a worker whose parent is gone (killed
    with SIGKILL, which no handler sees) exits within a second instead of waiting forever for work."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="trainsim-parent-watch", daemon=True).start()


def import_ray() -> Any:  # noqa: ANN401 - the ray module
    """The ray module, or a one-line ConfigError naming the extra to install."""
    try:
        import ray
    except ImportError:
        raise ConfigError("--ray", "Ray is not installed", f"{RAY_INSTALL}, or drop --ray") from None
    return ray


def _probe(address: str) -> None:
    """Refuse a Ray address nothing listens on at once (ray.init would retry it for minutes)."""
    client = address.startswith("ray://")
    hostport = address.removeprefix("ray://").rsplit("/", 1)[0]
    host, sep, port_text = hostport.rpartition(":")
    if not sep:
        host, port_text = hostport, "10001" if client else "6379"
    host = host.strip("[]")
    fix = "start one with `ray start --head` and pass its address (HOST:6379 or ray://HOST:10001), or use --ray auto"
    try:
        port = int(port_text)
        if not 0 < port < 65536:
            raise ValueError(port_text)
    except ValueError:
        raise ConfigError("--ray", f"'{address}' has no valid port", fix) from None
    try:
        with socket.create_connection((host, port), timeout=5):
            pass
    except (OSError, UnicodeError) as exc:
        raise ConfigError("--ray", f"nothing answers at {host}:{port} ({exc.strerror or exc})"
                          if isinstance(exc, OSError) else f"'{address}' is not a host name", fix) from None


class Runner:
    """Evaluates job dicts: `workers` == 1 in this process, > 1 in a persistent pool of that many local
    processes (spawned, so safe beside threads), or on Ray when `ray` is 'auto' (a running cluster, else
    a new local one started with `ray_init_kwargs`) or a cluster address; with Ray, `workers` caps the
    tasks in flight (0: one per CPU of the cluster). A Ray that is already initialised is used as it is
    and left running; one this runner started is shut down by `close()`."""

    def __init__(self, workers: int = 1, ray: str | None = None,
                 ray_init_kwargs: dict[str, Any] | None = None) -> None:
        if ray is not None and (not isinstance(ray, str) or not ray.strip()):
            raise ConfigError("--ray", f"must be 'auto' or a cluster address, got {ray!r}",
                              "pass --ray auto, or --ray HOST:PORT (or ray://HOST:10001)")
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < (0 if ray else 1):
            raise ConfigError("--jobs", f"must be a whole number >= 1, got {workers!r}", "pass a worker count")
        self.workers = workers
        self.ray_address = ray
        self._pool: ProcessPoolExecutor | None = None
        self._ray: Any = None
        self._remote: Any = None
        self._ray_started = False
        if ray is not None:
            self._connect_ray(ray.strip(), ray_init_kwargs or {})

    # -------------------------------------------------------------------------------------------- ray

    def _connect_ray(self, address: str, init_kwargs: dict[str, Any]) -> None:
        ray = import_ray()
        self._ray = ray
        quiet = {"logging_level": "ERROR", "log_to_driver": False}
        if not ray.is_initialized():
            try:
                if address == "auto":
                    try:
                        ray.init(address="auto", **quiet)
                    except ConnectionError:  # no cluster running here: start a local one
                        ray.init(include_dashboard=False, **quiet, **init_kwargs)
                else:
                    _probe(address)
                    ray.init(address=address, **quiet)
            except ConfigError:
                raise
            except Exception as exc:  # ray's own errors: ConnectionError, RuntimeError, ValueError, ...
                raise ConfigError("--ray", f"cannot connect to Ray at {address} ({_first_line(exc)})",
                                  "start one with `ray start --head` and pass its address, or use --ray auto") \
                    from None
            self._ray_started = True
        self._remote = ray.remote(num_cpus=1)(evaluate)
        if self.workers == 0:
            self.workers = max(1, int(ray.cluster_resources().get("CPU", 1)))

    def _ray_imap(self, jobs: list[dict[str, Any]]) -> Iterator[tuple[int, dict[str, Any]]]:
        ray = self._ray
        pending: dict[Any, int] = {}
        nxt = 0
        try:
            while nxt < len(jobs) or pending:
                while nxt < len(jobs) and len(pending) < self.workers:
                    pending[self._remote.remote(jobs[nxt])] = nxt
                    nxt += 1
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    i = pending.pop(ref)
                    try:
                        row = ray.get(ref)
                    except ray.exceptions.RayTaskError:  # evaluate itself raised: a bug, shown as it is
                        raise
                    except ray.exceptions.RayError as exc:  # a worker or node died (out of memory, ...)
                        raise ConfigError("--ray", f"the Ray task of job {i + 1} failed ({_first_line(exc)})",
                                          RESUME_FIX) from None
                    yield i, row
        finally:
            for ref in pending:  # an interrupted map: nothing left running for this batch
                ray.cancel(ref, force=True)

    # ---------------------------------------------------------------------------------------- local

    def _pool_imap(self, jobs: list[dict[str, Any]]) -> Iterator[tuple[int, dict[str, Any]]]:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_init_worker, initargs=(os.getpid(),))
        pool = self._pool
        futures: dict[Future[dict[str, Any]], int] = {}
        nxt = 0
        limit = 2 * self.workers  # a few queued per worker: results stream back, an interrupt cancels little
        try:
            while nxt < len(jobs) or futures:
                while nxt < len(jobs) and len(futures) < limit:
                    futures[pool.submit(evaluate, jobs[nxt])] = nxt
                    nxt += 1
                done, _ = wait(futures, return_when=FIRST_COMPLETED)
                for f in done:
                    i = futures.pop(f)
                    yield i, f.result()
        except BrokenProcessPool:
            self._pool = None  # unusable: the next map starts a new one
            pool.shutdown(wait=False, cancel_futures=True)
            raise ConfigError("--jobs", "a worker process died (out of memory?)",
                              f"use fewer --jobs ({RESUME_FIX})") from None
        finally:
            for f in futures:
                f.cancel()

    # ------------------------------------------------------------------------------------------ API

    def imap(self, jobs: list[dict[str, Any]]) -> Iterator[tuple[int, dict[str, Any]]]:
        """(index in `jobs`, row) for each job, as they finish (in any order)."""
        jobs = list(jobs)
        if self._ray is not None:
            return self._ray_imap(jobs)
        if self.workers > 1 and len(jobs) > 1:
            return self._pool_imap(jobs)
        return ((i, evaluate(job)) for i, job in enumerate(jobs))

    def map(self, jobs: list[dict[str, Any]], progress: Progress | None = None) -> list[dict[str, Any]]:
        """The rows of `jobs`, in the jobs' order; progress(done, total) after each one."""
        jobs = list(jobs)
        rows: list[dict[str, Any] | None] = [None] * len(jobs)
        for done, (i, row) in enumerate(self.imap(jobs), 1):
            rows[i] = row
            if progress is not None:
                progress(done, len(jobs))
        return rows  # type: ignore[return-value] - every slot is filled

    def close(self, *, stop: bool = False) -> None:
        """End the worker pool and a Ray this runner started; `stop` (on an error or Ctrl-C, as the context
        manager does) also stops workers in the middle of a job instead of waiting for them."""
        pool, self._pool = self._pool, None
        if pool is not None:
            # the worker processes, to stop them mid-job (no public way before Python 3.14)
            procs = list((getattr(pool, "_processes", None) or {}).values()) if stop else []
            pool.shutdown(wait=not stop, cancel_futures=True)
            for p in procs:
                if p.is_alive():
                    p.terminate()
            for p in procs:
                p.join(timeout=5)
        if self._ray is not None and self._ray_started:
            self._ray.shutdown()
            self._ray_started = False

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(stop=exc_type is not None)


def run_with_store(jobs: list[dict[str, Any]], runner: Runner, store: ResultsStore | None = None,
                   study: str = "", progress: Progress | None = None) -> tuple[list[dict[str, Any]], int, int]:
    """Rows of all `jobs` in their order, with how many were evaluated now and how many came from the store.

    Jobs whose key is in `store` are not evaluated again (nor is a job listed twice); each new row is
    committed to the store as it arrives, so a killed run loses at most the jobs in flight and a rerun
    continues where it stopped. progress(done, total) counts the jobs evaluated now."""
    keys = [job_key(j) for j in jobs]
    found = store.rows(keys) if store is not None else {}
    rows: dict[str, dict[str, Any]] = dict(found)
    todo: list[dict[str, Any]] = []
    todo_keys: list[str] = []
    seen: set[str] = set(rows)
    for k, j in zip(keys, jobs, strict=True):
        if k not in seen:
            seen.add(k)
            todo.append(j)
            todo_keys.append(k)
    for done, (i, row) in enumerate(runner.imap(todo), 1):
        if store is not None:
            store.add([row], study)
        rows[todo_keys[i]] = row
        if progress is not None:
            progress(done, len(todo))
    return [rows[k] for k in keys], len(todo), len(found)
