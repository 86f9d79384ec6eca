"""Pipeline parallel over ``torch.distributed``: the model's layers split into stages, one process each.

With ``--pp N`` stage 0 (the first layers and the embedding) runs in the engine's process on
the step-loop thread; stages 1..N-1 are spawned worker processes, each holding a contiguous
run of layers (:func:`~diag.bundled_engine.model_config.stage_layers`) and a KV-cache shard for those layers
only. The last stage applies the final norm and LM head and sends the logits back to stage 0,
where the engine samples.

A step's sequences are split into micro-batches (``--pp-microbatches``, default N; never more
than the step's sequences) so that stages overlap: while stage 1 runs micro-batch 0, stage 0
runs micro-batch 1. Activations ``[tokens, hidden]`` travel by real point-to-point
``send``/``recv`` (gloo on CPU, NCCL on CUDA), each preceded by a one-number header (the token
count): the wait for the header is idle time, the payload's transfer after it is ``comm``.

Account per step (:class:`PipelineAccount`), every stage measured in its own process and
reported to stage 0 over its control pipe once its share of the step is done:

* ``compute_s[k]`` — stage k's forward passes (its layers, plus embed / LM head);
* ``comm_s[k]`` — stage k in ``send`` calls, waiting for its sends, and receiving payloads;
* ``bubble_s[k]`` — the rest of stage 0's step window: the time stage k idled, waiting for its
  input (pipeline fill) or for the others to finish (drain).

Control plane: stage 0 sends each step's micro-batches (``SeqInput`` lists) to every worker
over a pipe, as TP does. Threading: one thread (the step loop) drives a runner; ``shutdown``
may be called from any thread once the loop has stopped.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Sequence

import torch

from diag.bundled_engine.kv_cache import PagedKVCache
from diag.bundled_engine.model import LlamaModel, ModelSpec, SeqInput
from diag.bundled_engine.tp import (CacheSpec, TPError, await_ready, check_alive, connect_store, make_cache,
                            make_process_group, make_store, rank_device, spawn_workers, stop_workers)

_ACCOUNT_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class PipelineAccount:
    """One step through the pipeline, in seconds: stage 0's window ``wall_s`` and, per stage
    (index = stage), its compute, its send/recv time and its idle time (``bubble_s``)."""

    microbatches: int
    wall_s: float
    compute_s: tuple[float, ...]
    comm_s: tuple[float, ...]
    bubble_s: tuple[float, ...]

    @property
    def pp_size(self) -> int:
        return len(self.compute_s)

    @property
    def mean_comm_s(self) -> float:
        """Send/recv seconds per stage: the step's ``comm`` in stage-averaged wall time."""
        return sum(self.comm_s) / len(self.comm_s)

    @property
    def mean_bubble_s(self) -> float:
        """Idle seconds per stage: the share of the step's wall time the pipeline wasted."""
        return sum(self.bubble_s) / len(self.bubble_s)

    @property
    def bubble_share(self) -> float:
        """Idle stage-seconds / (stages x wall), 0..1; (N-1)/(M+N-1) for M equal micro-batches."""
        return self.mean_bubble_s / self.wall_s if self.wall_s > 0 else 0.0


def split_microbatches(seqs: Sequence[SeqInput], n: int) -> list[list[SeqInput]]:
    """At most ``n`` contiguous groups of ``seqs`` with token counts as even as a greedy cut
    allows (order kept, so the logits come back in the step's order); none empty."""
    seqs = list(seqs)
    n = max(1, min(n, len(seqs)))
    total = sum(len(s.token_ids) for s in seqs)
    out: list[list[SeqInput]] = [[]]
    done = 0
    for i, s in enumerate(seqs):
        left_groups = n - len(out)
        left_seqs = len(seqs) - i
        # close the current group once it holds its share, or when each later group needs one of the rest
        if out[-1] and left_groups > 0 and (done >= total * len(out) / n or left_seqs <= left_groups):
            out.append([])
        out[-1].append(s)
        done += len(s.token_ids)
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Link:
    """Point-to-point sends and receives of one stage over the pipeline's process group.

    Messages of micro-batch ``i`` use tags ``4i`` / ``4i+1`` (activation header / payload) and
    ``4i+2`` / ``4i+3`` (logits); tags restart every step, when every message has been matched.
    """

    def __init__(self, pg: object, device: torch.device) -> None:
        self.pg = pg
        self.device = device
        self.pending: list[object] = []
        self.comm_s = 0.0

    def send(self, t: torch.Tensor, dst: int, tag: int) -> None:
        """Header (token count) then payload, both asynchronous; their completion is waited in :meth:`flush`."""
        t0 = time.perf_counter()
        head = torch.tensor([t.shape[0]], dtype=torch.long, device=self.device)
        self.pending.append(self.pg.send([head], dst, tag))  # type: ignore[attr-defined]
        self.pending.append(self.pg.send([t.contiguous()], dst, tag + 1))  # type: ignore[attr-defined]
        self.comm_s += time.perf_counter() - t0

    def recv(self, shape: tuple[int, ...], dtype: torch.dtype, src: int, tag: int) -> torch.Tensor:
        """Wait for the header (idle: not counted), then receive the payload (counted as comm)."""
        head = torch.empty(1, dtype=torch.long, device=self.device)
        self.pg.recv([head], src, tag).wait()  # type: ignore[attr-defined]
        if int(head.item()) != shape[0]:
            raise TPError(f"pipeline stage got {int(head.item())} rows from stage {src}, expected {shape[0]}")
        t0 = time.perf_counter()
        out = torch.empty(shape, dtype=dtype, device=self.device)
        self.pg.recv([out], src, tag + 1).wait()  # type: ignore[attr-defined]
        self.comm_s += time.perf_counter() - t0
        return out

    def flush(self) -> None:
        t0 = time.perf_counter()
        for w in self.pending:
            w.wait()  # type: ignore[attr-defined]
        self.pending.clear()
        self.comm_s += time.perf_counter() - t0


def _num_tokens(mb: Sequence[SeqInput]) -> int:
    return sum(len(s.token_ids) for s in mb)


def _num_logits(mb: Sequence[SeqInput]) -> int:
    return sum(1 for s in mb if s.want_logits)


def _run_stage(model: LlamaModel, cache: PagedKVCache, link: _Link, mbs: Sequence[Sequence[SeqInput]]) -> float:
    """A worker stage's share of one step (stage >= 1): receive, compute, pass on. Returns compute seconds."""
    rank, last = model.pp_rank, model.is_last_stage
    h, vocab = model.cfg.hidden_size, model.cfg.vocab_size
    compute_s = 0.0
    for i, mb in enumerate(mbs):
        x = link.recv((_num_tokens(mb), h), model.cfg.torch_dtype, rank - 1, 4 * i)
        t0 = time.perf_counter()
        out = model.forward_stage(mb, cache, x)
        _sync(model.device)
        compute_s += time.perf_counter() - t0
        if not last:
            assert out is not None
            link.send(out, rank + 1, 4 * i)
        elif out is not None:
            assert out.shape == (_num_logits(mb), vocab)
            link.send(out, 0, 4 * i + 2)
    link.flush()
    return compute_s


def _worker_main(rank: int, world: int, store_port: int, spec: ModelSpec, cache_spec: CacheSpec, num_threads: int,
                 conn: Connection) -> None:
    """Entry point of pipeline stage ``rank`` (>= 1) in its own process. Ignores SIGINT (rank 0
    stops workers with "stop", or they exit when its pipe closes)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        torch.set_num_threads(max(1, num_threads))
        store = connect_store(store_port, world)
        rank_spec = replace(spec, device=rank_device(spec, rank))
        pg = make_process_group(store, rank, world, rank_spec.device)
        model = rank_spec.build(pp_rank=rank, pp_size=world)
        cache = make_cache(model, cache_spec)
        link = _Link(pg, model.device)
        conn.send(("ready", None))
    except Exception as exc:  # report start-up failures to stage 0 in one line
        conn.send(("error", f"PP stage {rank} failed to start: {exc}"))
        return
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg[0] == "forward":
            try:
                link.comm_s = 0.0
                compute_s = _run_stage(model, cache, link, msg[1])
                conn.send(("account", compute_s, link.comm_s))
            except Exception:
                traceback.print_exc()
                return
        elif msg[0] == "stop":
            return


class PipelineParallelRunner:
    """``pp=N >= 2``: stage 0 on the calling thread, stages 1..N-1 in spawned processes.

    ``last_pipeline`` holds the :class:`PipelineAccount` of the latest :meth:`execute`.
    """

    tp_size = 1

    def __init__(self, spec: ModelSpec, cache_spec: CacheSpec, pp_size: int, num_threads_per_rank: int = 1,
                 microbatches: int = 2) -> None:
        if pp_size < 2:
            raise ValueError("PipelineParallelRunner needs pp_size >= 2")
        if microbatches < 1:
            raise ValueError(f"--pp-microbatches must be >= 1, got {microbatches}")
        spec.resolve_config().validate_pp(pp_size)
        if spec.device.startswith("cuda") and torch.cuda.device_count() < pp_size:
            raise TPError(f"--pp {pp_size} needs {pp_size} CUDA devices, found {torch.cuda.device_count()}")
        self.pp_size = pp_size
        self.microbatches = microbatches
        self.last_pipeline: PipelineAccount | None = None
        self._store = make_store(pp_size)
        port = self._store.port
        self._conns, self._procs = spawn_workers(
            _worker_main, pp_size,
            lambda rank, child: (rank, pp_size, port, spec, cache_spec, num_threads_per_rank, child), "ttft-pp-stage")
        try:
            pg = make_process_group(self._store, 0, pp_size, rank_device(spec, 0))
            self.model = spec.build(pp_rank=0, pp_size=pp_size)
            self.cache = make_cache(self.model, cache_spec)
            self._link = _Link(pg, self.model.device)
            await_ready(self._conns, "PP stage")
        except BaseException:
            self.shutdown()
            raise

    def execute(self, seqs: Sequence[SeqInput]) -> tuple[torch.Tensor | None, float]:
        """One step through every stage: (logits of the sequences that want them, in order;
        send/recv seconds per stage, averaged over stages). Sets :attr:`last_pipeline`."""
        mbs = split_microbatches(seqs, self.microbatches)
        check_alive(self._procs, "PP stage")
        t_start = time.perf_counter()
        for conn in self._conns:
            conn.send(("forward", mbs))
        link, model = self._link, self.model
        link.comm_s = 0.0
        compute_s = 0.0
        for i, mb in enumerate(mbs):
            t0 = time.perf_counter()
            x = model.forward_stage(mb, self.cache)
            _sync(model.device)
            compute_s += time.perf_counter() - t0
            assert x is not None
            link.send(x, 1, 4 * i)
        parts: list[torch.Tensor] = []
        vocab = model.cfg.vocab_size
        for i, mb in enumerate(mbs):
            n = _num_logits(mb)
            if n:
                parts.append(link.recv((n, vocab), torch.float32, self.pp_size - 1, 4 * i + 2))
        link.flush()
        accounts = [self._account(rank, conn) for rank, conn in enumerate(self._conns, start=1)]
        wall_s = time.perf_counter() - t_start
        comp = (compute_s,) + tuple(a[0] for a in accounts)
        comm = (link.comm_s,) + tuple(a[1] for a in accounts)
        bubble = tuple(max(0.0, wall_s - c - m) for c, m in zip(comp, comm))
        self.last_pipeline = PipelineAccount(len(mbs), wall_s, comp, comm, bubble)
        logits = torch.cat(parts) if parts else None
        return logits, self.last_pipeline.mean_comm_s

    def _account(self, rank: int, conn: Connection) -> tuple[float, float]:
        """Stage ``rank``'s (compute_s, comm_s) of the step just run."""
        if not conn.poll(_ACCOUNT_TIMEOUT_S):
            raise TPError(f"PP stage {rank} sent no step account within {_ACCOUNT_TIMEOUT_S:.0f} s")
        msg = conn.recv()
        if msg[0] != "account":
            raise TPError(f"PP stage {rank}: unexpected message {msg[0]!r}")
        return float(msg[1]), float(msg[2])

    def shutdown(self) -> None:
        stop_workers(self._conns, self._procs)
