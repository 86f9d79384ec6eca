"""Overhead of ``ttft instrument`` on Hugging Face ``transformers serve``: on/off, interleaved.

Budget: < 1 % of throughput and of TTFT p50. Two servers on the same random-weight Llama
(tests/thirdparty/hf_serve.py) run side by side on loopback: ``transformers serve`` as it is
("off") and ``ttft instrument --capture DIR -- transformers serve`` ("on": the import hooks emit
every stage span and write a real capture). One client (the probe's ``StreamingClient``, in this
process) sends them the same bursts: ``--concurrency`` requests at once, the same prompts to
both sides, the sides in ABBA order (off, on, on, off, ...), ``--pairs`` pairs after a warm-up.
A pair of bursts a few tens of ms apart shares the machine's state (frequency, neighbours,
the hypervisor), which rounds of whole probe runs seconds apart do not: on this 2-core VM a
pair's ratio spreads ~12 % (IQR) where 0.5 s rounds spread ~30 %.

Pinning (default when the machine has >= 2 CPUs; ``--no-pin``): both servers on one CPU, the
client on another, so the idle side and the client never take the active side's core, and
both sides run on the same core. The instrumented server's deferred work (its span-build and
export threads wake every 0.5 s) can then run during a plain burst and slow it; the benchmark
measures that leak (the "on" server's CPU during each "off" burst) and the figures are taken
with it moved back to its own side (plain wall time less the leak, instrumented wall time plus
it: a conservative bound, as if every leaked ns had delayed the plain burst one for one).

Both servers run torch with ``--torch-threads`` intra-op threads (default 1: OMP_NUM_THREADS).
A third figure is the server's own CPU per request (on-CPU ns of its threads from /proc
schedstat), summed over the whole run per side so that deferred work counts wherever it ran,
and judged over blocks of ``--block`` pairs; in toggle mode it is also split by server thread
(event loop, inference thread, our span-build thread: py-spy names the Python threads), which
says where the hooks' CPU runs. Verdicts use a distribution-free 95 % interval of the median
per-pair (per-block) cost (sign test): "within budget" only when the whole interval lies under
1 %, "OVER BUDGET" only when it lies above, else "undecided". The pair, not the run, is the unit:
on this VM TTFT moves between states minutes long (a run's quarters had p50s of 22 and 37 ms),
and each side's whole-run p50 compared that way differed by 1-3 % between two halves of the
SAME side's bursts (even vs odd pairs, 2026-12-03), where the per-pair median ratio of
same-side bursts was +0.03 %. ``--save FILE`` keeps every pair's figures for analyses of
their own. Run:
``python benchmarks/instrument_overhead.py [--pairs 600] [--concurrency 1] [--hidden-size 256]
[--layers 4] [--continuous-batching] [--profile]``. ``--profile`` also py-spies the
instrumented server and prints the share of its busy samples in ttft-diag's own frames.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "thirdparty"))

from collectors.probe import LengthSpec, WorkloadSpec  # noqa: E402
from collectors.probe.client import StreamingClient  # noqa: E402
from collectors.probe.endpoint import resolve_endpoint  # noqa: E402
from collectors.probe.workload import PromptItem, Workload  # noqa: E402
from hf_serve import (  # noqa: E402
    CB_SMALL_CACHE_ARGS, InstrumentedTransformersServe, TransformersServe, build_tiny_llama,
)
from proc_sched import (  # noqa: E402
    add_thread_deltas, cpu_delta_s, own_threads_ns, pin_own_threads, pin_tree, thread_labels, tree_cpu,
)

BUDGET = 0.01


class Burst:
    """One burst's figures: output tokens, TTFT p50 (s), wall time (s)."""

    __slots__ = ("tokens", "ttft_s", "wall_s")

    def __init__(self, tokens: int, ttft_s: float, wall_s: float) -> None:
        self.tokens, self.ttft_s, self.wall_s = tokens, ttft_s, wall_s

    @property
    def tput(self) -> float:
        """Output tokens/s over the burst's wall time."""
        return self.tokens / self.wall_s


async def burst(client: StreamingClient, items: list[PromptItem], tag: str) -> Burst | None:
    """Send ``items`` at once through ``client``; None when any request failed (the random model
    can say EOS first: no content), and its pair is then left out."""
    t0 = time.perf_counter()
    rs = await asyncio.gather(*(client.request(it, f"{tag}-{i}") for i, it in enumerate(items)))
    wall_s = time.perf_counter() - t0
    bad = [r for r in rs if not r.ok]
    if bad:
        print(f"burst {tag}: {len(bad)} failed request(s) ({bad[0].error}: {bad[0].error_detail}); its pair is "
              "left out", file=sys.stderr)
        return None
    tokens = sum(r.output_tokens or 0 for r in rs)
    return Burst(tokens, statistics.median(r.ttft_s for r in rs if r.ttft_s is not None), wall_s)


def abba(rounds: int) -> list[str]:
    """off, on, on, off, off, on, ...: ``rounds`` pairs."""
    order: list[str] = []
    for i in range(rounds):
        order += ["off", "on"] if i % 2 == 0 else ["on", "off"]
    return order


def iqr(values: list[float]) -> float:
    """Interquartile range (0 with fewer than 2 values)."""
    if len(values) < 2:
        return 0.0
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[2] - q[0]


def spread(values: list[float]) -> str:
    return (f"median {statistics.median(values):.4f} (IQR {iqr(values):.4f}, min {min(values):.4f}, "
            f"max {max(values):.4f}, n={len(values)})")


#: py-spy frames by owner: a busy sample is ours when, from its leaf up, the first frame with an owner is ours
_OURS = ("collectors/", "diag/", "opentelemetry/")
_ENGINE = ("transformers/", "torch/", "tokenizers", "uvicorn/", "starlette/", "anyio/", "asyncio/", "fastapi/", "h11/")
_IDLE = ("Condition.wait", "Event.wait", "_wait_for_tstate_lock", "select ", "poll ")


#: the thread that writes meta.json after a --toggle-signal flip: its frames, at the stack's root
_TOGGLE_META = ("Thread.run (", "Instrumentation.write_meta (")


def own_share(raw_path: Path) -> tuple[int, int, dict[str, int], int]:
    """(busy samples, samples whose innermost owned frame is ours, ours by function, of ours the
    toggle's meta.json writes) from ``py-spy -f raw``.

    Idle waits are not busy. Standard-library frames count for whoever called them (our guard's
    ``contextlib``, the exporter's ``json``), so this is the self time of the hooks, the span
    build and the export, not of the engine code they wrap. The thread that records each flip in
    meta.json runs only because this benchmark flips the hooks hundreds of times; it is counted
    apart (the last figure).
    """
    busy, ours, by_fn, toggle = 0, 0, {}, 0
    for line in raw_path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if not count.isdigit() or len(frames) < 2 or frames[-1].startswith(_IDLE):
            continue
        n = int(count)
        busy += n
        if any(frames[i].startswith(_TOGGLE_META[0]) and frames[i + 1].startswith(_TOGGLE_META[1])
               for i in range(len(frames) - 1)):
            toggle += n
        for frame in reversed(frames[1:]):
            where = frame[frame.find("(") + 1:]
            if any(o in where for o in _OURS):
                ours += n
                fn = frame.split(" (")[0]
                by_fn[fn] = by_fn.get(fn, 0) + n
                break
            if any(e in where for e in _ENGINE):
                break
    return busy, ours, by_fn, toggle


def start_py_spy(pid: int, out: Path) -> subprocess.Popen[bytes] | None:
    """``py-spy record`` (raw, 200 Hz, non-blocking) on ``pid``; None when py-spy is not installed."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(exe).exists():
        print("--profile: py-spy not found; no profile", file=sys.stderr)
        return None
    return subprocess.Popen([exe, "record", "-p", str(pid), "-r", "200", "-f", "raw", "-o", str(out),
                             "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def server_pid(srv: TransformersServe) -> int:
    """The Python process serving (``ttft instrument`` runs ``transformers serve`` as its child)."""
    assert srv.proc is not None
    try:
        kids = Path(f"/proc/{srv.proc.pid}/task/{srv.proc.pid}/children").read_text().split()
    except OSError:
        kids = []
    return int(kids[0]) if kids else srv.proc.pid


def median_ci(values: list[float], confidence: float = 0.95) -> tuple[float, float] | None:
    """Distribution-free confidence interval of the median: order statistics (sign test).

    [x_(k), x_(n+1-k)] with the largest k whose binomial tail P(Bin(n, 1/2) < k) stays within
    (1 - confidence) / 2; None when n is too small for any such interval (n < 6 at 95 %).
    """
    n = len(values)
    xs = sorted(values)
    tail = (1.0 - confidence) / 2
    k, below = 0, 0.0  # below = P(Bin(n, 1/2) <= k - 1)
    while k < n // 2:
        nxt = below + math.comb(n, k) / 2 ** n
        if nxt > tail:
            break
        below, k = nxt, k + 1
    if k == 0:
        return None
    return xs[k - 1], xs[n - k]


def verdict(costs: list[float]) -> str:
    """Judge per-pair costs (fractions, + = the hooks cost) against the budget, honestly.

    'within budget' only when the whole 95 % interval of the median cost lies under the budget,
    'OVER BUDGET' only when it lies wholly above; otherwise the run cannot tell (noise), and the
    interval says how far apart the pairs were. Wall-clock pairs on a shared box are noisy: a
    median under 1 % with a wide interval is 'undecided', not a pass.
    """
    ci = median_ci(costs)
    if ci is None:
        return f"undecided: {len(costs)} pair(s), too few for a 95% interval of the median (need >= 6)"
    lo, hi = ci
    where = f"95% CI of the median [{lo:+.2%}, {hi:+.2%}]"
    if hi < BUDGET:
        return f"within budget ({where})"
    if lo > BUDGET:
        return f"OVER BUDGET ({where})"
    return f"undecided: {where} straddles the {BUDGET:.0%} budget (noise; more --pairs or a quieter machine)"


class Toggle:
    """Flips one ``ttft instrument --toggle-signal USR2`` server between hooks on and off, and
    waits until its meta.json lists the flip (the handler has run)."""

    def __init__(self, pid: int, meta_path: Path, on: bool) -> None:
        self.pid, self.meta_path, self.on, self.flips = pid, meta_path, on, 0

    def toggles_seen(self) -> int:
        try:
            return len(json.loads(self.meta_path.read_text()).get("instrument", {}).get("toggles", []))
        except (OSError, ValueError):
            return -1

    async def set(self, on: bool) -> None:
        if on == self.on:
            return
        os.kill(self.pid, signal.SIGUSR2)
        self.flips += 1
        deadline = time.monotonic() + 5
        while self.toggles_seen() < self.flips:
            if time.monotonic() > deadline:
                raise SystemExit(f"the server did not flip its hooks within 5 s (pid {self.pid})")
            await asyncio.sleep(0.002)
        self.on = on


async def measure(servers: dict[str, TransformersServe], args: argparse.Namespace,
                  toggle: Toggle | None = None, per_thread: dict[str, dict[str, list[int]]] | None = None
                  ) -> dict[str, list[tuple[Burst | None, float, float]]]:
    """Warm both sides, then ``args.pairs`` ABBA pairs of bursts.

    Per side, per burst: (the burst, its own server's CPU s during it, CPU s during it that
    belongs to the other side: the idle server's, or with ``toggle`` (one server, hooks flipped
    between bursts) our span threads' during a hooks-off burst, the on bursts' deferred work).
    ``per_thread`` (side -> thread key -> [on-CPU ns, run-queue ns, timeslices]), when given,
    sums each live server thread's scheduling over that side's timed bursts.
    """
    pids = {side: srv.proc.pid for side, srv in servers.items() if srv.proc is not None}
    clients: dict[str, StreamingClient] = {}
    for side, srv in servers.items():
        endpoint, _notes = await resolve_endpoint(srv.url, "chat")
        clients[side] = await StreamingClient(endpoint, args.concurrency, timeout_s=120, exact_output=False).open()
    workload = Workload(WorkloadSpec(LengthSpec.parse(str(args.input_tokens)), LengthSpec.parse(str(args.output_tokens)),
                                     exact_output=False, seed=7))
    other = {"off": "on", "on": "off"}
    out: dict[str, list[tuple[Burst | None, float, float]]] = {"off": [], "on": []}

    async def one(side: str, items: list[PromptItem], tag: str) -> tuple[Burst | None, float, float]:
        if toggle is not None:
            await toggle.set(side == "on")
        await asyncio.sleep(0.01)  # the same pause before every burst (a flip's wait ends before it)
        own0, oth0, thr0 = tree_cpu(pids[side]), tree_cpu(pids[other[side]]), own_threads_ns(pids[side])
        b = await burst(clients[side], items, tag)
        own1 = tree_cpu(pids[side])
        own = cpu_delta_s(own0, own1)
        if per_thread is not None and not tag.startswith("warm"):
            add_thread_deltas(per_thread.setdefault(side, {}), own0[1], own1[1])
        if toggle is None:
            return b, own, cpu_delta_s(oth0, tree_cpu(pids[other[side]]))
        deferred = (own_threads_ns(pids[side]) - thr0) / 1e9 if side == "off" else 0.0
        return b, own - deferred, deferred

    try:
        for w in range(args.warmup_bursts):
            items = [workload.next_item() for _ in range(args.concurrency)]
            for side in ("off", "on"):
                await one(side, items, f"warm{w}{side}")
        items: list[PromptItem] = []
        for i, side in enumerate(abba(args.pairs)):
            if i % 2 == 0:
                items = [workload.next_item() for _ in range(args.concurrency)]
            b, own, leak = await one(side, items, f"p{i // 2}{side}")
            out[side].append((b, own, leak))
            if args.verbose and b is not None:
                print(f"pair {i // 2 + 1:>4} {side:<3} {b.tput:8.1f} tok/s  TTFT p50 {b.ttft_s * 1e3:7.2f} ms  "
                      f"server CPU {own * 1e3:6.1f} ms  other side's CPU {leak * 1e3:5.2f} ms", flush=True)
    finally:
        for c in clients.values():
            await c.close()
    return out


def print_thread_split(per_thread: dict[str, dict[str, list[int]]], labels: dict[str, str], n_req: int) -> None:
    """Where the instrumented side's extra CPU runs: each server thread's on-CPU ms per request
    in hooks-off and hooks-on bursts (toggle mode: the same threads on both sides) and the cost
    the hooks add on it: on - off, except for our own ``ttft-*`` threads, whose CPU during
    hooks-off bursts is the on bursts' deferred work (on + off). The costs add up to the server
    CPU figure's difference. Beside them, off / on: ms per request the thread waited on a run
    queue (runnable, the core busy with another thread) and timeslices it ran per request."""
    by_label: dict[str, list[list[float]]] = {}
    for side, col in (("off", 0), ("on", 1)):
        for key, sched in per_thread.get(side, {}).items():
            row = by_label.setdefault(labels.get(key, f"{key} (exited or unnamed)"), [[0.0] * 3, [0.0] * 3])
            for i, scale in enumerate((1e6, 1e6, 1.0)):
                row[col][i] += sched[i] / scale / n_req

    def cost(label: str, off_ms: float, on_ms: float) -> float:
        return on_ms + off_ms if label.startswith("ttft-") else on_ms - off_ms

    rows = sorted(by_label.items(), key=lambda kv: -abs(cost(kv[0], kv[1][0][0], kv[1][1][0])))
    print("server CPU per request by thread, ms: hooks off / hooks on / cost of the hooks; "
          "run-queue wait ms off / on; timeslices off / on")
    for label, (off, on) in rows:
        if max(off[0], on[0]) >= 0.005:
            print(f"  {label:<44} {off[0]:8.3f} {on[0]:8.3f} {cost(label, off[0], on[0]):+8.3f}   "
                  f"{off[1]:7.3f} {on[1]:7.3f}   {off[2]:6.1f} {on[2]:6.1f}")
    total = sum(cost(label, off[0], on[0]) for label, (off, on) in by_label.items())
    print(f"  {'all live threads':<44} {sum(v[0][0] for v in by_label.values()):8.3f} "
          f"{sum(v[1][0] for v in by_label.values()):8.3f} {total:+8.3f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=600, help="off/on pairs of bursts (default 600)")
    ap.add_argument("--concurrency", type=int, default=1, help="requests per burst, sent at once (default 1)")
    ap.add_argument("--warmup-bursts", type=int, default=30, help="untimed bursts per server first (default 30)")
    ap.add_argument("--block", type=int, default=25, help="pairs per block for the CPU verdict (default 25)")
    ap.add_argument("--input-tokens", type=int, default=64)
    ap.add_argument("--output-tokens", type=int, default=16)
    ap.add_argument("--continuous-batching", action="store_true", help="both servers in --continuous-batching mode")
    ap.add_argument("--torch-threads", type=int, default=1, help="OMP_NUM_THREADS of both servers (default 1)")
    ap.add_argument("--hidden-size", type=int, default=256, help="the random Llama's hidden size (default 256)")
    ap.add_argument("--layers", type=int, default=4, help="the random Llama's layers (default 4)")
    ap.add_argument("--mode", choices=("toggle", "processes"), default="toggle",
                    help="toggle: ONE instrumented server whose hooks are flipped on and off between bursts "
                         "(ttft instrument --toggle-signal USR2): the same process, memory layout and threads on "
                         "both sides; processes: a plain server against an instrumented one (adds what differs "
                         "between two processes, see --control)")
    ap.add_argument("--control", action="store_true",
                    help="A/A control: the 'on' side is a second plain server (what the method reads when "
                         "nothing differs; its interval should hold 0)")
    ap.add_argument("--no-pin", action="store_true", help="leave CPU placement to the scheduler")
    ap.add_argument("--own-threads-apart", action="store_true",
                    help="diagnostic: pin our ttft-* threads to the client's first CPU, off the engine's core "
                         "(does the engine thread's extra CPU come from sharing its core with them?); the "
                         "client then shares a core with them, so judge CPU from such a run, not wall time")
    ap.add_argument("--save", metavar="FILE", help="write every pair's figures (JSON) for analysis later")
    ap.add_argument("-v", "--verbose", action="store_true", help="one line per burst")
    ap.add_argument("--profile", action="store_true",
                    help="py-spy the instrumented server during the timed pairs: the share of its busy samples "
                         "spent in ttft-diag's own frames (py-spy's own CPU then weighs on the wall-clock ratios: "
                         "judge those from a run without it)")
    args = ap.parse_args(argv)
    if min(args.pairs, args.concurrency, args.torch_threads, args.block) < 1:
        ap.error("--pairs, --concurrency, --torch-threads and --block must be >= 1")
    os.environ["OMP_NUM_THREADS"] = str(args.torch_threads)  # the servers inherit it
    cpus = sorted(os.sched_getaffinity(0))
    pin = not args.no_pin and len(cpus) >= 2

    tmp = Path(tempfile.mkdtemp(prefix="ttft-instr-bench-"))
    model = build_tiny_llama(tmp / "tiny-llama", spaced=True, hidden_size=args.hidden_size, layers=args.layers)
    extra = CB_SMALL_CACHE_ARGS if args.continuous_batching else None
    kw = {"continuous_batching": args.continuous_batching, "extra_args": extra}
    toggle_mode = args.mode == "toggle" and not args.control
    if toggle_mode:
        instrumented = InstrumentedTransformersServe(model, tmp / "srv", ["--toggle-signal", "USR2"], **kw)
        plain = instrumented
    else:
        plain = TransformersServe(model, **kw)
        instrumented = (TransformersServe(model, **kw) if args.control
                        else InstrumentedTransformersServe(model, tmp / "srv", **kw))
    with contextlib.ExitStack() as stack:
        for srv in {id(plain): plain, id(instrumented): instrumented}.values():
            stack.enter_context(srv)
        servers: dict[str, TransformersServe] = {"off": plain, "on": instrumented}
        try:
            if pin:
                for srv in (plain, instrumented):
                    assert srv.proc is not None
                    pin_tree(srv.proc.pid, cpus[-1])
                os.sched_setaffinity(0, set(cpus[:-1]))
                if args.own_threads_apart:
                    pin_own_threads(instrumented.proc.pid, cpus[0])  # type: ignore[union-attr]
            engine_pid = server_pid(instrumented)
            spy = start_py_spy(engine_pid, tmp / "py-spy.txt") if args.profile else None
            t0 = time.monotonic()
            toggle = Toggle(engine_pid, tmp / "srv" / "meta.json", on=True) if toggle_mode else None
            per_thread: dict[str, dict[str, list[int]]] = {}
            results = asyncio.run(measure(servers, args, toggle, per_thread if toggle_mode else None))
            elapsed_s = time.monotonic() - t0
            labels = thread_labels(engine_pid) if toggle_mode else {}
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                spy.wait(30)
        finally:
            if args.continuous_batching:  # its CB loop thread does not stop on SIGINT
                for srv in (plain, instrumented):
                    if srv.proc is not None and srv.proc.poll() is None:
                        srv.proc.send_signal(signal.SIGTERM)
    spans_path = tmp / "srv" / "spans.otlp.jsonl"
    meta_path = tmp / "srv" / "meta.json"
    n_spans = sum(1 for _ in spans_path.open()) if spans_path.exists() else 0

    pairs = [(off, on) for off, on in zip(results["off"], results["on"]) if off[0] is not None and on[0] is not None]
    if len(pairs) < args.pairs:
        print(f"{args.pairs - len(pairs)} pair(s) left out: a request of theirs failed", file=sys.stderr)
    # the idle side's CPU during a burst ran on that burst's core: moved back to its own side
    # (the instrumented server's deferred work during a plain burst, and the plain server's idle
    # ticks during an instrumented one), as if every leaked ns had delayed the burst one for one
    leak_s = [off[2] for off, _on in pairs]
    wall = [(off[0].wall_s - off[2] + on[2], on[0].wall_s - on[2] + off[2]) for off, on in pairs]
    tput_ratio = [(w_off / w_on) * on[0].tokens / off[0].tokens for (off, on), (w_off, w_on) in zip(pairs, wall)]
    # for TTFT, the share of each leak that fell before the first token (spread evenly over the burst)
    adj_ttft = [(off[0].ttft_s - (off[2] - on[2]) * min(1.0, off[0].ttft_s / off[0].wall_s),
                 on[0].ttft_s + (off[2] - on[2]) * min(1.0, on[0].ttft_s / on[0].wall_s)) for off, on in pairs]
    ttft_ratio = [t_on / max(t_off, 1e-9) for t_off, t_on in adj_ttft]
    raw_tput = [on[0].tput / off[0].tput for off, on in pairs]
    raw_ttft = [on[0].ttft_s / off[0].ttft_s for off, on in pairs]
    blocks = [pairs[i:i + args.block] for i in range(0, len(pairs) - args.block + 1, args.block)]
    cpu_ratio = [sum(on[1] + off[2] for off, on in blk) / sum(off[1] + on[2] for off, on in blk) for blk in blocks]
    n_req = len(pairs) * args.concurrency
    cpu_off_ms = sum(off[1] + on[2] for off, on in pairs) / n_req * 1e3
    cpu_on_ms = sum(on[1] + off[2] for off, on in pairs) / n_req * 1e3

    mode = ("--continuous-batching" if args.continuous_batching else "plain") + (
        ", A/A CONTROL: two plain servers" if args.control else
        ", one server, hooks flipped on/off" if toggle_mode else ", a plain and an instrumented server")
    where = (f"servers pinned to CPU {cpus[-1]}, client to {cpus[:-1]}" if pin else "unpinned")
    print(f"\ntransformers serve ({mode}, Llama hidden {args.hidden_size} x {args.layers} layers), {args.pairs} off/on "
          f"pairs of bursts of {args.concurrency}, {args.input_tokens}/{args.output_tokens} tokens, "
          f"{args.torch_threads} torch thread(s), {where}; {elapsed_s:.0f} s; instrumented capture: {n_spans} span lines")
    print(f"plain burst: {statistics.median(off[0].wall_s for off, _ in pairs) * 1e3:.1f} ms wall, TTFT p50 "
          f"{statistics.median(off[0].ttft_s for off, _ in pairs) * 1e3:.2f} ms; the other side's CPU during a burst "
          f"(the instrumented side's deferred span work, the idle server's ticks): {statistics.mean(leak_s) * 1e3:.3f} ms "
          f"into a plain burst, {statistics.mean(on[2] for _, on in pairs) * 1e3:.3f} ms into an instrumented one; "
          f"each moved back to its side")
    print(f"throughput ratio (instrumented / plain): {spread(tput_ratio)}; raw {statistics.median(raw_tput):.4f}")
    print(f"TTFT p50 ratio   (instrumented / plain): {spread(ttft_ratio)}; raw {statistics.median(raw_ttft):.4f}")
    tput_costs = [1.0 - r for r in tput_ratio]
    ttft_costs = [r - 1.0 for r in ttft_ratio]
    print(f"budget < {BUDGET:.0%}: throughput cost {statistics.median(tput_costs):+.2%} -> {verdict(tput_costs)}")
    print(f"budget < {BUDGET:.0%}: TTFT p50 cost   {statistics.median(ttft_costs):+.2%} -> {verdict(ttft_costs)}")
    if args.save:
        rows = [{"off": {"tokens": off[0].tokens, "ttft_s": off[0].ttft_s, "wall_s": off[0].wall_s, "cpu_s": off[1],
                         "other_side_cpu_s": off[2]},
                 "on": {"tokens": on[0].tokens, "ttft_s": on[0].ttft_s, "wall_s": on[0].wall_s, "cpu_s": on[1],
                        "other_side_cpu_s": on[2]}} for off, on in pairs]
        threads: dict[str, dict[str, list[int]]] = {}
        for side, by_key in per_thread.items():
            for key, sched in by_key.items():  # threads of one OS name (OpenMP workers) are summed
                acc = threads.setdefault(side, {}).setdefault(labels.get(key, key), [0, 0, 0])
                acc[:] = [a + b for a, b in zip(acc, sched)]
        Path(args.save).write_text(json.dumps({"args": vars(args), "mode": mode, "pairs": rows,
                                               "thread_sched_cpu_wait_ns_slices": threads}))
        print(f"per-pair figures saved to {args.save}")
    if cpu_ratio:
        print(f"server CPU per request (whole run, deferred work included): {cpu_on_ms:.2f} ms instrumented vs "
              f"{cpu_off_ms:.2f} ms plain ({cpu_on_ms / cpu_off_ms - 1.0:+.2%}; {cpu_on_ms - cpu_off_ms:+.3f} ms); "
              f"over {len(blocks)} blocks of {args.block} pairs: {verdict([r - 1.0 for r in cpu_ratio])}")
    if toggle_mode and per_thread:
        print_thread_split(per_thread, labels, n_req)
    if args.profile and (tmp / "py-spy.txt").exists():
        busy, ours, by_fn, toggle = own_share(tmp / "py-spy.txt")
        top = ", ".join(f"{fn} {n}" for fn, n in sorted(by_fn.items(), key=lambda kv: -kv[1])[:5])
        print(f"py-spy of the instrumented server: {ours} of {busy} busy samples in ttft-diag's own frames "
              f"({ours / max(busy, 1):.2%}; the hooks' direct CPU, not GIL or cache effects); {toggle} of them the "
              f"toggle's meta.json writes, which only this benchmark's flips cause: {(ours - toggle) / max(busy, 1):.2%} "
              f"without them; top: {top}")
    if meta_path.exists():
        inst = json.loads(meta_path.read_text()).get("instrument", {})
        print(f"hooks: {len(inst.get('patched', []))} patched, {inst.get('hook_errors_total', '?')} errors swallowed; "
              f"capture {tmp / 'srv'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
