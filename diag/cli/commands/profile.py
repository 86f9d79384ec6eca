"""``ttft profile PID``: attach py-spy to a serving process and attribute its CPU time to stages."""

from __future__ import annotations

import argparse

from diag.ground.capture import CaptureError, CaptureWriter


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from collectors.pyspy_engines import PATTERN_SETS  # frame tables only: re, no pandas

    p = sub.add_parser(
        "profile",
        help="py-spy a serving process: CPU time by stage (tokenizer, scheduler, forward, ...)",
        description="Attach py-spy to PID for a window, attribute its samples to stages by frame patterns "
        "(bundled engine, vLLM, SGLang, Hugging Face transformers serve; generic: the frames every Python "
        "stack shares, for any other engine) and write them into a capture (profile/pyspy.raw.txt, "
        "profile/pyspy.json).",
    )
    p.add_argument("pid", type=int, help="process id of the serving process")
    p.add_argument("-d", "--duration", type=float, default=10.0, metavar="S", help="window in seconds (default 10)")
    p.add_argument("--rate", type=int, default=100, metavar="HZ", help="samples per second (default 100)")
    p.add_argument("--engine", default="bundled", choices=list(PATTERN_SETS),
                   help="whose frame table attributes the samples (default bundled)")
    p.add_argument("--gil", action="store_true", help="only samples holding the GIL")
    p.add_argument("--idle", action="store_true", help="include idle threads")
    p.add_argument("--subprocesses", action="store_true", help="also profile child processes (engine workers)")
    p.add_argument("--native", action="store_true",
                   help="also unwind native frames (Rust tokenizers, torch kernels, libc waits), attributed too")
    p.add_argument("-o", "--output", required=True, metavar="CAPTURE", help="capture directory to write into")
    return p


def run(args: argparse.Namespace) -> int:
    from collectors.pyspy import PySpyError, PySpySampler

    sampler = PySpySampler(args.pid, duration_s=args.duration, rate_hz=args.rate, engine=args.engine, gil=args.gil,
                           idle=args.idle, subprocesses=args.subprocesses, native=args.native)
    if not sampler.available:
        raise CaptureError(sampler.note)
    writer = CaptureWriter(args.output, meta={"what_ran": {"command": "ttft profile", "pid": args.pid,
                                                           "engine": args.engine, "duration_s": args.duration,
                                                           "native": args.native}})
    try:
        profile = sampler.record(args.output)
    except PySpyError as exc:
        writer.close()
        raise CaptureError(str(exc)) from exc
    writer.update_meta(pyspy=profile.to_dict())
    writer.close()
    print(f"py-spy: {profile.samples_total} samples of PID {args.pid} -> {args.output}/profile/")
    for stage, share in sorted(profile.shares.items(), key=lambda kv: -kv[1]):
        print(f"  {stage:<14} {share * 100:5.1f}%")
    unattributed = profile.top_frames.get("other", [])
    if unattributed:  # what no rule of this engine's table names: the leaves to look at
        print("  unattributed (other), top leaves: "
              + "; ".join(f"{frame} {count}" for frame, count in unattributed[:3]))
    return 0
