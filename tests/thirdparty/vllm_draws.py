"""The real-vLLM matrix's draws: vLLM configurations whose bottleneck the configuration sets, each at
drawn lengths and loads (the families are described in :mod:`vllm_matrix`, which runs them). Pure
data and numpy draws by (seed, index); no process, any thread.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from diag.analysis.scenarios.random_truth import CLIENT_ONLY_ALSO

#: ttft diagnose's probing budget on each draw
DIAGNOSE_BUDGET = "90s"
#: the draws CI runs (``test_vllm_matrix.py``): 6, every family at least once
CI_SEED = 20261206
CI_DRAWS = 6
FAMILIES = ("queue", "kv_cache", "prefix_cache", "prefill_compute", "healthy")
#: families run only when asked (``--families``): not yet named right in every mode, so kept out of the
#: rotation that CI and the fresh-seed figures use (docs/random-matrix.md says what each mode reads)
EXTRA_FAMILIES = ("head_of_line", "grammar_compile", "lora_adapters", "pd_transfer")
MODES = ("client-only", "metrics", "traces", "diagnose")
#: per mode, the truth -> other verdicts scored right (what that mode cannot tell apart; module doc)
ALSO_RIGHT: dict[str, dict[str, frozenset[str]]] = {
    # a client cannot see disaggregation: the bundled matrix's equivalents (random_truth._CLIENT_SEES)
    "client-only": {"kv_cache": frozenset({"queue"}), "pd_transfer": CLIENT_ONLY_ALSO["pd_transfer"]},
    "diagnose": {"kv_cache": frozenset({"queue"})},
    "traces": {"kv_cache": frozenset({"queue"})},
    "metrics": {},
}
#: vLLM's CPU KV block size in tokens (``vllm/platforms/cpu.py``: ``cache_config.block_size = 128`` when unset)
BLOCK_TOKENS = 128
#: a request's tokens beyond its drawn prompt and answer: the BOS token, and the probe reaching a prompt
#: length through words (not exactly)
SLACK_TOKENS = 8
#: measured requests of a probe at least (the rules want 20 before they are sure of a one-level reading)
MIN_REQUESTS = 24
#: the ``pd_transfer`` family's kinds, taken in turn (:func:`draw`)
PD_KINDS = ("admission", "link", "roomy")


@dataclass(frozen=True)
class VLLMDraw:
    """One draw: the server's flags, the probe's load and workload, the truth and why it holds."""

    seed: int
    index: int
    family: str
    expected: str
    server_args: tuple[str, ...]
    max_model_len: int
    concurrency: int
    requests: int
    input_tokens: int
    output_tokens: int
    #: the probe's ``--shared-prefix N:R`` ("" for none)
    shared_prefix: str = ""
    #: prompts drawn uniformly in ``input_tokens`` +- this (0: all ``input_tokens`` long)
    input_spread: int = 0
    #: the probe's ``--inject-long TOKENS:EVERY`` ("" for none): a long prompt among the short ones
    inject_long: str = ""
    #: the probe's ``--response-format`` ("" for none) and its generated schema's fields
    response_format: str = ""
    schema_properties: int = 24
    #: LoRA adapters served (``l0``..) and asked for, one per request (the probe's ``--lora``); 0: none
    lora_adapters: int = 0
    #: ``pd_transfer`` only: the link between the instances in Mbit/s (a private network namespace's
    #: loopback under ``tc tbf``, UCX over TCP); 0: the loopback as it is (UCX over shared memory).
    #: A P/D draw's ``server_args`` are its decode instance's.
    link_mbit: int = 0
    why: str = ""

    @property
    def disaggregated(self) -> bool:
        """A prefill/decode pair behind a proxy (``vllm_pd.py``), not one server."""
        return self.family == "pd_transfer"

    def setup(self) -> str:
        """The served configuration in a few words (the matrix's log)."""
        flags = " ".join(self.server_args)
        if not self.disaggregated:
            return flags or "(defaults)"
        return (f"P/D pair, decode {flags or '(defaults)'}, "
                + (f"a {self.link_mbit} Mbit/s link" if self.link_mbit else "the loopback as it is"))

    @property
    def name(self) -> str:
        return f"v{self.index:03d}-{self.family}-{self.expected}"

    def probe_args(self) -> list[str]:
        lo, hi = self.short_range()
        out = ["-c", str(self.concurrency), "-n", str(self.requests), "--warmup", "2",
               "--input-tokens", f"uniform:{lo}-{hi}" if hi > lo else str(lo), "--output-tokens", str(self.output_tokens),
               "--seed", str(self.seed * 1000 + self.index)]
        return (out + (["--shared-prefix", self.shared_prefix] if self.shared_prefix else [])
                + (["--inject-long", self.inject_long] if self.inject_long else [])
                + (["--response-format", self.response_format, "--schema-properties", str(self.schema_properties)]
                   if self.response_format else [])
                + (["--lora", ",".join(self.adapter_names())] if self.lora_adapters else []))

    def adapter_names(self) -> list[str]:
        return [f"l{i}" for i in range(self.lora_adapters)]

    def short_range(self) -> tuple[int, int]:
        """The drawn prompt lengths in tokens (shortest, longest), a mix's long ones apart."""
        return self.input_tokens - self.input_spread, self.input_tokens + self.input_spread

    def prompt_range(self) -> tuple[int, int]:
        """The users' prompt lengths in tokens (shortest, longest; the long ones of a mix included)."""
        lo, hi = self.short_range()
        return lo, max(hi, int(self.inject_long.split(":")[0])) if self.inject_long else hi

    def diagnose_args(self) -> list[str]:
        """``ttft diagnose``'s flags: what the users send (``--workload``: their prompt lengths and how
        many they keep in flight), the typical prompt and answer; no target and diagnose's own ramp, as
        most users start. On a draw designed healthy that ramp reaches the one server core's capacity
        (TTFT rising as the streams share it) far above the users' load: their concurrency makes the
        verdict judge "nothing waits" at their load, the capacity above it being no wait of theirs.
        Their peak load as the ramp's top (``--max-concurrency``) would leave a cap too little room
        above it to be read."""
        lo, hi = self.prompt_range()
        said = (",response_format=schema" if self.response_format.startswith("schema") else "") + (
            f",lora={'+'.join(self.adapter_names())}" if self.lora_adapters else "")
        return ["--budget", DIAGNOSE_BUDGET, "--input-tokens", str(self.input_tokens),
                "--output-tokens", str(self.output_tokens), "--workload",
                f"prompt_tokens={lo}-{hi},concurrency={self.concurrency}{said}",
                *(["--schema-properties", str(self.schema_properties)] if self.response_format else [])]

    def diagnosable(self) -> str | None:
        """Why ``ttft diagnose`` (its own experiment) cannot show this draw's cause, or None."""
        if self.disaggregated:
            return ("a P/D pair: diagnose takes no --metrics (a client alone sees only TTFT, scored client-only "
                    "from the probe), and its ramp would add ~2 minutes on the pair's 2 cores")
        if self.shared_prefix:
            return "a prefix design: diagnose's own prompts share no prefix"
        if self.response_format == "schema:repeat":
            return "one schema for the whole run: --workload cannot say the users send only one"
        return None

    def skipped_modes(self) -> dict[str, str]:
        """The modes this draw is not scored in, each with why."""
        out = {"diagnose": why} if (why := self.diagnosable()) else {}
        if self.disaggregated:
            out["traces"] = ("vLLM's spans carry no role: a request's two spans (the prefill instance's one-token "
                             "request, the decode instance's) would be read as one server's; a P/D split is read "
                             "from spans only where they say it (the bundled engine's ttft.pd.*, rules/features/pd.py)")
        return out


def _rng(seed: int, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, index])


def draw(seed: int, index: int, families: Sequence[str] = FAMILIES) -> VLLMDraw:
    """Draw ``index`` of ``seed``: deterministic; the family rotates over ``families`` from a
    seeded start, so any ``len(families)`` consecutive draws hold every family."""
    g = _rng(seed, index)
    seeded = np.random.default_rng(seed)
    start = int(seeded.integers(len(families)))
    family = families[(start + index) % len(families)]
    s = dict(seed=seed, index=index, family=family)
    if family == "pd_transfer":
        # the family's n-th draw takes the n-th kind (from a seeded start): any 3 of its draws in a row hold each
        kind = PD_KINDS[((start + index) // len(families) + int(seeded.integers(len(PD_KINDS)))) % len(PD_KINDS)]
        return _pd_draw(g, kind, s)
    if family == "queue":
        k = int(g.integers(1, 4))
        c = k + int(g.integers(2, 2 * k + 3))
        out = int(g.integers(48, 161))
        prompt = int(g.integers(16, 257))
        return VLLMDraw(**s, expected="queue", server_args=("--max-num-seqs", str(k)), max_model_len=2048,
                        concurrency=c, requests=max(MIN_REQUESTS, 4 * c), input_tokens=prompt,
                        output_tokens=out, why=f"--max-num-seqs {k} under {c} streams of {out}-token answers: {c - k} wait in "
                            "vLLM's queue for a whole answer")
    if family == "kv_cache":
        prompt = int(g.integers(96, 321))
        out = int(g.integers(96, 257))
        per_req = math.ceil((prompt + out + SLACK_TOKENS) / BLOCK_TOKENS)
        fits = int(g.integers(1, 3))
        # one block of the pool is vLLM's null block (``vllm/v1/core/block_pool.py``): B blocks hold B - 1
        usable = per_req * fits + int(g.integers(0, 2))
        blocks = usable + 1
        c = fits + int(g.integers(2, 5))
        return VLLMDraw(**s, expected="kv_cache", server_args=("--num-gpu-blocks-override", str(blocks)),
                        max_model_len=usable * BLOCK_TOKENS, concurrency=c, requests=max(MIN_REQUESTS, 4 * c),
                        input_tokens=prompt, output_tokens=out,
                        why=f"{blocks} KV blocks of {BLOCK_TOKENS} tokens hold {fits} request(s) of "
                            f"{prompt}+{out} tokens; {c} streams wait for blocks and are preempted")
    if family == "prefix_cache":
        prefix = int(g.integers(1024, 1793))
        suffix = int(g.integers(16, 65))
        uses = int(g.integers(3, 6))
        off = bool(g.integers(0, 2))
        groups = int(g.integers(5, 7))
        args = ("--no-enable-prefix-caching",) if off else ()
        return VLLMDraw(**s, expected="prefix_cache" if off else "healthy", server_args=args, max_model_len=2048,
                        concurrency=1, requests=groups * (uses + 1), input_tokens=suffix,
                        output_tokens=int(g.integers(8, 33)), shared_prefix=f"{prefix}:{uses}",
                        why=(f"prefix caching off: every use of a {prefix}-token prefix prefills it again"
                             if off else f"prefix caching on (vLLM's default): repeats of a {prefix}-token "
                                         "prefix prefill only their suffix"))
    if family == "prefill_compute":
        prompt = int(g.integers(1100, 1501))
        spread = int(g.integers(250, 401))
        return VLLMDraw(**s, expected="prefill_compute", server_args=(), max_model_len=2048, concurrency=1,
                        requests=MIN_REQUESTS, input_tokens=prompt, input_spread=spread,
                        output_tokens=int(g.integers(8, 33)),
                        why=f"one stream of {prompt - spread}..{prompt + spread}-token prompts: nothing waits, and "
                            "each prompt's prefill is many decode steps (the verdict contract's prompt-work cause)")
    if family == "head_of_line":
        budget = int(g.integers(64, 193))
        long_tokens = int(g.integers(1000, 1701))
        every = int(g.integers(3, 6))
        c = int(g.integers(3, 6))
        return VLLMDraw(**s, expected="head_of_line", server_args=("--max-num-batched-tokens", str(budget)),
                        max_model_len=2048, concurrency=c, requests=max(MIN_REQUESTS, 8 * every),
                        input_tokens=int(g.integers(16, 97)), output_tokens=int(g.integers(16, 49)),
                        inject_long=f"{long_tokens}:{every}",
                        why=f"a step budget of {budget} tokens: a {long_tokens}-token prompt every {every} requests "
                            f"prefills over ~{math.ceil(long_tokens / budget)} steps ahead of the short ones that "
                            f"arrive behind it (vLLM schedules running requests first)")
    if family == "grammar_compile":
        c = int(g.integers(1, 4))
        group = int(g.integers(2 * c + 2, 2 * c + 6))
        fields = int(g.integers(80, 161))
        fresh = bool(g.integers(0, 2))
        return VLLMDraw(**s, expected="grammar_compile" if fresh else "healthy", server_args=(), max_model_len=2048,
                        concurrency=c, requests=max(MIN_REQUESTS, group * int(g.integers(4, 7))),
                        input_tokens=int(g.integers(16, 129)),
                        output_tokens=int(g.integers(8, 33)),
                        response_format=f"schema:{group}" if fresh else "schema:repeat", schema_properties=fields,
                        why=(f"a fresh {fields}-field schema every {group} requests at {c} stream(s): each first use "
                             "waits for xgrammar to compile it" if fresh else
                             f"one {fields}-field schema for the run: compiled in the warm-up, cached after"))
    if family == "lora_adapters":
        n = int(g.integers(3, 5))
        slots = 1 if bool(g.integers(0, 2)) else n
        c = int(g.integers(4, 7))
        return VLLMDraw(**s, expected="lora_adapters" if slots < n else "healthy",
                        server_args=("--enable-lora", "--max-loras", str(slots), "--max-cpu-loras", str(slots),
                                     "--max-lora-rank", "8"), max_model_len=2048, concurrency=c, requests=40,
                        input_tokens=int(g.integers(32, 97)), output_tokens=int(g.integers(24, 49)), lora_adapters=n,
                        why=(f"{n} adapters, one slot, {c} streams: a request for an adapter not in flight waits for "
                             "the running ones' turn" if slots < n else f"{n} adapters in {n} slots: all batch together"))
    c = int(g.integers(1, 3))
    out = int(g.integers(16, 65))
    # prompt work under ~4 decode steps here (a prompt token costs ~1/60 of a step on this CPU; the
    # contract makes prompt work a cause from 6 steps)
    prompt = int(g.integers(16, 193))
    return VLLMDraw(**s, expected="healthy", server_args=(), max_model_len=2048, concurrency=c,
                    requests=MIN_REQUESTS, input_tokens=prompt, output_tokens=out,
                    why=f"vLLM's defaults at {c} stream(s): nothing waits")


def _pd_draw(g: np.random.Generator, kind: str, s: dict[str, Any]) -> VLLMDraw:
    """A ``pd_transfer`` draw of ``kind`` (:data:`PD_KINDS`; module doc): ``admission``, the decode
    instance short of running places; ``link``, a slow link between the instances (truth
    ``pd_transfer`` both); ``roomy``, the near-miss (``healthy``).

    Scored in two modes: ``client-only`` (the probe through the proxy; a client cannot see
    disaggregation, so what the bundled matrix scores right for it client-only is right here:
    :data:`ALSO_RIGHT`) and ``metrics`` (the probe's capture with both instances' own /metrics,
    ``prefill=URL decode=URL``: the pd_transfer rule's engine-metrics check). Skipped
    (:meth:`VLLMDraw.skipped_modes`): ``traces``, because vLLM's spans carry no role, so a request's
    two spans would be read as one server's, and the rules split P/D from spans only where they say
    it (the bundled engine's); ``diagnose``, which takes no ``--metrics`` and would add its ramp to a
    draw already two server starts long on 2 cores.
    """
    if kind == "admission":
        k = int(g.integers(1, 3))
        c = k + int(g.integers(2, k + 3))
        out = int(g.integers(32, 97))
        return VLLMDraw(**s, expected="pd_transfer", server_args=("--max-num-seqs", str(k)), max_model_len=2048,
                        concurrency=c, requests=max(MIN_REQUESTS, 4 * c), input_tokens=int(g.integers(16, 193)),
                        output_tokens=out,
                        why=f"the decode instance capped at {k} running (--max-num-seqs {k}) under {c} streams of "
                            f"{out}-token answers: each request's KV waits there for a running one's whole answer")
    if kind == "link":
        mbit = int(g.integers(6, 25))
        prompt = int(g.integers(64, 321))
        blocks = math.ceil((prompt + SLACK_TOKENS) / BLOCK_TOKENS)
        return VLLMDraw(**s, expected="pd_transfer", server_args=(), max_model_len=2048,
                        concurrency=int(g.integers(1, 3)), requests=MIN_REQUESTS, input_tokens=prompt,
                        output_tokens=int(g.integers(16, 49)), link_mbit=mbit,
                        why=f"a {mbit} Mbit/s link between the instances (tc tbf, UCX over TCP): a {prompt}-token "
                            f"prompt's {blocks} KV block(s) of {BLOCK_TOKENS} tokens take several times its prefill "
                            "to move")
    c = int(g.integers(1, 3))
    return VLLMDraw(**s, expected="healthy", server_args=(), max_model_len=2048, concurrency=c, requests=MIN_REQUESTS,
                    input_tokens=int(g.integers(16, 193)), output_tokens=int(g.integers(16, 65)),
                    why=f"a roomy pair on the loopback as it is (UCX over shared memory) at {c} stream(s): the "
                        "transfer is a few ms and nothing waits for a decode place")


def draws(seed: int, n: int, families: Sequence[str] = FAMILIES) -> list[VLLMDraw]:
    return [draw(seed, i, families) for i in range(n)]
