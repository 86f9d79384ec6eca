"""Model runners: one rank in-process (``tp=1``) or tensor parallel over ``torch.distributed``.

Pipeline parallel (``--pp N``) lives in :mod:`diag.bundled_engine.pp` and shares this module's
process-group helpers (:func:`make_store`, :func:`make_process_group`, :func:`spawn_workers`,
:func:`await_ready`, :func:`stop_workers`); :func:`make_runner` builds either.

With ``--tp N`` the model is split over N ranks: rank 0 runs in the engine's process (on the
step-loop thread, like vLLM's driver worker) and ranks 1..N-1 are spawned worker processes.
Each rank holds its shard of attention heads (Q and KV heads), the matching rows/columns of
the output projection, and its share of the MLP intermediate columns (gate/up) and rows
(down); it owns a KV-cache shard with its local KV heads. After the attention output and the
MLP down projection every rank calls a real all-reduce (gloo on CPU, NCCL on CUDA).

Control plane: rank 0 sends each step's :class:`~diag.bundled_engine.model.SeqInput` list to the
workers over a pipe; data plane: the all-reduces. Rank 0 measures the wall time it spends in
collectives (waiting for the slowest rank included) per step: ``comm_s`` of :meth:`execute`.
The ``collective_latency_ms`` fault adds a sleep inside that measured window per all-reduce.

Threading: a runner is driven by one thread (the step loop). ``shutdown`` may be called from
any thread once the loop has stopped.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Callable, Protocol, Sequence

import torch

from diag.bundled_engine.kv_cache import PagedKVCache
from diag.bundled_engine.model import LlamaModel, ModelSpec, SeqInput

_WORKER_READY_TIMEOUT_S = 300.0
_COLLECTIVE_TIMEOUT_S = 120.0


class TPError(RuntimeError):
    """Tensor-parallel start-up or worker failure (one-line message)."""


@dataclass(frozen=True)
class CacheSpec:
    """KV-cache geometry shared by all ranks (blocks and block size in tokens)."""

    num_blocks: int
    block_size: int


class ModelRunner(Protocol):
    """What the engine needs from a model runner."""

    model: LlamaModel
    cache: PagedKVCache
    tp_size: int
    pp_size: int

    def execute(self, seqs: Sequence[SeqInput]) -> tuple[torch.Tensor | None, float]:
        """One forward over the batch: (logits ``[n, vocab]`` float32, seconds in collectives)."""
        ...

    def shutdown(self) -> None:
        ...


def make_cache(model: LlamaModel, spec: CacheSpec) -> PagedKVCache:
    """This rank's KV storage: its own layers (a pipeline stage's) and its local KV heads."""
    return PagedKVCache(
        len(model.layers),
        spec.num_blocks,
        spec.block_size,
        model.local_kv_heads,
        model.cfg.head_dim,
        model.cfg.torch_dtype,
        model.device,
    )


class LocalRunner:
    """``tp=1``: the whole model on the step-loop thread; ``comm_s`` is always 0."""

    tp_size = 1
    pp_size = 1

    def __init__(self, spec: ModelSpec, cache_spec: CacheSpec) -> None:
        self.model = spec.build()
        self.cache = make_cache(self.model, cache_spec)

    def execute(self, seqs: Sequence[SeqInput]) -> tuple[torch.Tensor | None, float]:
        return self.model.forward(seqs, self.cache), 0.0

    def shutdown(self) -> None:
        return None


def rank_device(spec: ModelSpec, rank: int) -> str:
    """The device of ``rank``: ``cuda:<rank>`` on CUDA (one GPU per rank), else the spec's."""
    if spec.device.startswith("cuda"):
        return f"cuda:{rank}"
    return spec.device


def make_store(world: int) -> torch.distributed.TCPStore:
    """Rank 0's rendezvous store on 127.0.0.1 (a free port; workers connect to ``.port``)."""
    return torch.distributed.TCPStore(
        "127.0.0.1",
        0,
        world,
        True,
        timeout=datetime.timedelta(seconds=_WORKER_READY_TIMEOUT_S),
        wait_for_workers=False,
    )


def connect_store(port: int, world: int) -> torch.distributed.TCPStore:
    """A worker's client of rank 0's store."""
    return torch.distributed.TCPStore(
        "127.0.0.1", port, world, False, timeout=datetime.timedelta(seconds=_WORKER_READY_TIMEOUT_S)
    )


def make_process_group(store: torch.distributed.Store, rank: int, world: int, device: str) -> object:
    """The process group of ``world`` ranks: NCCL on CUDA, gloo on CPU (collectives and send/recv)."""
    timeout = datetime.timedelta(seconds=_COLLECTIVE_TIMEOUT_S)
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
        return torch.distributed.ProcessGroupNCCL(store, rank, world, timeout=timeout)  # type: ignore[attr-defined]
    return torch.distributed.ProcessGroupGloo(store, rank, world, timeout)  # type: ignore[attr-defined]


def spawn_workers(target: Callable[..., None], world: int, args: Callable[[int, Connection], tuple[object, ...]],
                  name: str) -> tuple[list[Connection], list[mp.process.BaseProcess]]:
    """Spawn ranks 1..world-1 running ``target(*args(rank, child_conn))``; (parent pipes, processes)."""
    ctx = mp.get_context("spawn")
    conns: list[Connection] = []
    procs: list[mp.process.BaseProcess] = []
    for rank in range(1, world):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=target, args=args(rank, child), name=f"{name}{rank}", daemon=True)
        p.start()
        child.close()
        conns.append(parent)
        procs.append(p)
    return conns, procs


def await_ready(conns: Sequence[Connection], what: str) -> None:
    """Wait for each worker's ("ready", None); TPError (one line) on its error or a timeout."""
    for rank, conn in enumerate(conns, start=1):
        if not conn.poll(_WORKER_READY_TIMEOUT_S):
            raise TPError(f"{what} {rank} did not start within {_WORKER_READY_TIMEOUT_S:.0f} s")
        kind, detail = conn.recv()
        if kind != "ready":
            raise TPError(str(detail))


def check_alive(procs: Sequence[mp.process.BaseProcess], what: str) -> None:
    """TPError naming the first worker process that has exited."""
    for rank, proc in enumerate(procs, start=1):
        if not proc.is_alive():
            raise TPError(f"{what} {rank} (pid {proc.pid}) has exited (code {proc.exitcode})")


def stop_workers(conns: list[Connection], procs: list[mp.process.BaseProcess]) -> None:
    """Send "stop", join (5 s, then kill), close the pipes; empties both lists. Idempotent."""
    for conn in conns:
        try:
            conn.send(("stop", None))
        except (OSError, ValueError):
            pass
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join(timeout=5)
    for conn in conns:
        conn.close()
    conns.clear()
    procs.clear()


def _worker_main(
    rank: int,
    world: int,
    store_port: int,
    spec: ModelSpec,
    cache_spec: CacheSpec,
    num_threads: int,
    conn: Connection,
) -> None:
    """Entry point of TP rank ``rank`` (>= 1) in its own process.

    Ignores SIGINT (Ctrl-C reaches the whole process group): rank 0 stops workers with a
    "stop" message, or they exit when its pipe closes.
    """
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        torch.set_num_threads(max(1, num_threads))
        store = connect_store(store_port, world)
        from dataclasses import replace

        rank_spec = replace(spec, device=rank_device(spec, rank))
        pg = make_process_group(store, rank, world, rank_spec.device)

        def all_reduce(t: torch.Tensor) -> torch.Tensor:
            pg.allreduce([t]).wait()  # type: ignore[attr-defined]
            return t

        model = rank_spec.build(rank, world, all_reduce)
        cache = make_cache(model, cache_spec)
        conn.send(("ready", None))
    except Exception as exc:  # report start-up failures to rank 0 in one line
        conn.send(("error", f"TP rank {rank} failed to start: {exc}"))
        return
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        kind = msg[0]
        if kind == "forward":
            try:
                model.forward(msg[1], cache, compute_logits=False)
            except Exception:
                traceback.print_exc()
                return
        elif kind == "stop":
            return


class TensorParallelRunner:
    """``tp=N >= 2``: rank 0 on the calling thread, ranks 1..N-1 in spawned processes."""

    pp_size = 1

    def __init__(
        self,
        spec: ModelSpec,
        cache_spec: CacheSpec,
        tp_size: int,
        num_threads_per_rank: int = 1,
        collective_latency_ms: float = 0.0,
    ) -> None:
        if tp_size < 2:
            raise ValueError("TensorParallelRunner needs tp_size >= 2")
        spec.resolve_config().validate_tp(tp_size)
        if spec.device.startswith("cuda") and torch.cuda.device_count() < tp_size:
            raise TPError(f"--tp {tp_size} needs {tp_size} CUDA devices, found {torch.cuda.device_count()}")
        self.tp_size = tp_size
        self._latency_s = collective_latency_ms / 1000.0
        self._comm_s = 0.0
        self.num_all_reduces = 0
        self._store = make_store(tp_size)
        port = self._store.port
        self._conns, self._procs = spawn_workers(
            _worker_main, tp_size,
            lambda rank, child: (rank, tp_size, port, spec, cache_spec, num_threads_per_rank, child), "ttft-tp-rank")
        try:
            self._pg = make_process_group(self._store, 0, tp_size, rank_device(spec, 0))
            self.model = spec.build(0, tp_size, self._all_reduce)
            self.cache = make_cache(self.model, cache_spec)
            await_ready(self._conns, "TP rank")
        except BaseException:
            self.shutdown()
            raise

    def _all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        t0 = time.perf_counter()
        if self._latency_s > 0:
            time.sleep(self._latency_s)
        self._pg.allreduce([t]).wait()  # type: ignore[attr-defined]
        self._comm_s += time.perf_counter() - t0
        self.num_all_reduces += 1
        return t

    def execute(self, seqs: Sequence[SeqInput]) -> tuple[torch.Tensor | None, float]:
        seqs = list(seqs)
        check_alive(self._procs, "TP rank")
        for conn in self._conns:
            conn.send(("forward", seqs))
        self._comm_s = 0.0
        logits = self.model.forward(seqs, self.cache)
        return logits, self._comm_s

    def shutdown(self) -> None:
        stop_workers(self._conns, self._procs)


def make_runner(
    spec: ModelSpec,
    cache_spec: CacheSpec,
    tp_size: int = 1,
    num_threads_per_rank: int | None = None,
    collective_latency_ms: float = 0.0,
    pp_size: int = 1,
    pp_microbatches: int | None = None,
) -> ModelRunner:
    """Build the runner for ``tp_size`` x ``pp_size`` ranks (one of them 1). Threads per rank
    default to cores // ranks (>= 1); ``pp_microbatches`` defaults to ``pp_size``."""
    if tp_size > 1 and pp_size > 1:
        raise ValueError("--tp and --pp together are not supported by the bundled engine; use one of them")
    threads = num_threads_per_rank or max(1, (os.cpu_count() or 1) // (tp_size * pp_size))
    torch.set_num_threads(threads)
    if pp_size > 1:
        from diag.bundled_engine.pp import PipelineParallelRunner

        return PipelineParallelRunner(spec, cache_spec, pp_size, threads, pp_microbatches or pp_size)
    if tp_size <= 1:
        return LocalRunner(spec, cache_spec)
    return TensorParallelRunner(spec, cache_spec, tp_size, threads, collective_latency_ms)
