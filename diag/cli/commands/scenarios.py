"""``ttft scenarios list|run|check``: reproducible bottlenecks on the bundled engine."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from diag.cli import UsageError

if TYPE_CHECKING:
    from diag.analysis.scenarios.calibrate import Calibration


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "scenarios",
        help="reproducible bottleneck scenarios and the diagnosis matrix",
        description="Each scenario runs the bundled engine (its own process) with a configuration and a probe "
        "workload that produce one bottleneck class; loads and sizes come from a short calibration of this machine.",
    )
    ssub = p.add_subparsers(dest="scenarios_command", metavar="ACTION", required=True)
    ssub.add_parser("list", help="list the scenarios and their ground truth")
    r = ssub.add_parser("run", help="run one scenario into a directory of captures")
    r.add_argument("name", help="scenario name (see `ttft scenarios list`)")
    r.add_argument("-o", "--output", metavar="DIR", help="where to write (default: ./scenario-NAME)")
    r.add_argument("--calibration", metavar="FILE", help="reuse (or write) a calibration JSON file")
    _add_spread(r)
    c = ssub.add_parser("check", help="run scenarios and print the confusion table (server-side and client-only)")
    c.add_argument("names", nargs="*", metavar="NAME", help="scenarios to check (default: all)")
    c.add_argument("--fast", action="store_true", help="only the fast scenarios")
    c.add_argument("-o", "--output", metavar="DIR", default="scenario-runs", help="where the runs go (default ./scenario-runs)")
    c.add_argument("--calibration", metavar="FILE", help="reuse (or write) a calibration JSON file")
    c.add_argument("--json", action="store_true", help="print the matrix as JSON")
    c.add_argument("--random", type=int, metavar="N", help="run N random draws (wide parameter ranges, mixes, "
                   "near-misses; ground truth from the injection) instead of the catalogue")
    c.add_argument("--near-miss", type=int, metavar="M", help="also (or only) run M draws of the near-miss space: "
                   "every draw a near-miss (the mechanism present, not the cause; truth healthy), the families taken "
                   "in turn, so M >= 13 draws each once")
    c.add_argument("--seed", type=int, metavar="S", help="seed of the random draws (default: a fresh one, printed)")
    c.add_argument("--draw", type=int, metavar="I", default=0, help="first draw index (default 0), of each space: "
                   "--random 1 (or --near-miss 1) --seed S --draw I reproduces one draw")
    c.add_argument("--repeat", type=int, metavar="K", default=1,
                   help="run each draw K times and report the flip rate and the agreement (same verdict every run)")
    c.add_argument("--mode", choices=("server", "client", "both"), default="both",
                   help="diagnose with server spans, client-only, or both (default)")
    c.add_argument("--via", choices=("probe", "diagnose"), default="probe",
                   help="probe: each case's fixed probe, scored per --mode (default); diagnose: ttft diagnose "
                        "designs the experiment against each case's engine (client only), scored with its time "
                        "to verdict")
    c.add_argument("--budget", type=float, metavar="S", default=120.0,
                   help="with --via diagnose: each run's probing budget in seconds (ttft diagnose --budget)")
    _add_spread(c)
    m = ssub.add_parser("samples", help="regenerate samples/<scenario>/ (small captures, checked)")
    m.add_argument("names", nargs="*", metavar="NAME", help="scenarios (default: all)")
    m.add_argument("-o", "--output", metavar="DIR", default="samples", help="samples directory (default ./samples)")
    m.add_argument("--calibration", metavar="FILE", help="reuse (or write) a calibration JSON file")
    return p


def _add_spread(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="run each probe step in N client processes (ttft probe --workers); with --ray, N Ray actors")
    p.add_argument("--ray", metavar="ADDRESS", help="run the probe steps' workers as Ray actors (ttft probe --ray: "
                   "local, auto, ray://HOST:10001, HOST:PORT), joined once for the whole run; needs the ray extra")


def _spread(args: argparse.Namespace):
    """The scenario runner's ProbeWorkers from --workers/--ray (checked; one line when wrong)."""
    from diag.analysis.scenarios.runner import ProbeWorkers

    workers, ray = getattr(args, "workers", 1), getattr(args, "ray", None)  # samples has neither
    if workers < 1:
        raise UsageError("--workers must be >= 1")
    if ray is not None:
        from collectors.probe.ray_workers import check_address

        check_address(ray)  # a RayWorkersError: one line, exit code 2
    return ProbeWorkers(workers, ray)


def _pick(names: list[str], fast: bool) -> list:
    from diag.analysis.scenarios import SCENARIOS, get

    try:
        chosen = [get(n) for n in names] if names else list(SCENARIOS)
    except KeyError as exc:
        raise UsageError(exc.args[0]) from exc
    return [s for s in chosen if s.fast] if fast else chosen


def run(args: argparse.Namespace) -> int:
    from collectors.probe.ray_workers import kept
    from diag.analysis.scenarios import SCENARIOS, calibrate, check, confusion_table, diagnose_run, run_scenario, rows_to_dict

    if args.scenarios_command == "list":
        for s in SCENARIOS:
            print(f"{s.name:<22} -> {s.category:<16} {'' if s.fast else '(slow) '}{s.cause}")
        return 0
    where = _spread(args)
    if where.spread and args.scenarios_command == "check" and (
            args.via == "diagnose" or args.random is not None or args.near_miss is not None):
        raise UsageError("--workers and --ray run the catalogue's probe steps (check [NAME...], run); "
                         "not with --random, --near-miss or --via diagnose")
    log = (lambda m: print(m, file=sys.stderr, flush=True))
    log("calibrating this machine with the bundled engine ...")
    cal = calibrate(cache=args.calibration)
    log(f"  prefill {cal.prefill_ms_per_token:.3f} ms/token, decode step {cal.decode_step_ms:.2f} ms, "
        f"short-prompt TTFT {cal.ttft_short_ms:.1f} ms")
    if cal.noisy:
        log(f"  warning: the calibration rounds differed {cal.spread:.1f}x: something else is using this machine; "
            "scenario sizes keep about 2x of margin, so verdicts may miss")
    if args.scenarios_command == "run":
        (sc,) = _pick([args.name], False)
        out = Path(args.output or f"scenario-{sc.name}")
        with kept(where.ray_address, where.workers):
            run_ = run_scenario(sc, out, cal, log=log, where=where)
        for mode in ("server", "client-only"):
            v = diagnose_run(run_, mode)
            print(f"{sc.name} [{mode}]: {v.category} ({v.confidence:.2f}) - {v.title}")
        print(f"captures: {', '.join(str(p) for p in run_.all_captures)}  (expected: {sc.category})")
        return 0
    t0 = time.monotonic()
    if args.scenarios_command == "samples":
        from diag.analysis.scenarios.samples import make_samples

        rows = make_samples(_pick(args.names, False), args.output, cal, log=log)
        print(confusion_table(rows))
        return 0 if all(r.ok(m) for r in rows for m in ("server", "client-only")) else 1
    if args.via == "diagnose":
        return _check_via_diagnose(args, cal, log)
    if args.random is not None or args.near_miss is not None:
        return _check_random(args, cal, log)
    chosen = _pick(args.names, args.fast)
    if where.ray_address is not None:
        log(f"probe steps on {where.workers} Ray actor(s) at {where.ray_address}, placed once for the run ...")
    with kept(where.ray_address, where.workers):
        rows = check(chosen, args.output, cal, log=log, where=where)
    wall = time.monotonic() - t0
    if args.json:
        json.dump({"matrix": rows_to_dict(rows), "wall_s": wall, "calibration": cal.to_dict(),
                   "probe_workers": where.to_dict()}, sys.stdout, indent=2)
        print()
    else:
        print(confusion_table(rows))
        print(f"matrix wall time: {wall:.0f} s")
    return 0 if all(r.ok(m) for r in rows for m in ("server", "client-only")) else 1


def _check_via_diagnose(args: argparse.Namespace, cal: Calibration, log: Callable[[str], None]) -> int:
    """``check --via diagnose``: scenarios (or ``--random N`` draws) through ttft diagnose; 0 when none missed."""
    from diag.analysis.scenarios.via_diagnose import ViaDiagnoseReport, draws_via_diagnose, scenarios_via_diagnose

    if args.budget <= 0:
        raise UsageError("--budget must be > 0 seconds")
    if args.repeat != 1:
        raise UsageError("--repeat is not supported with --via diagnose")
    out = Path(args.output)
    t0 = time.monotonic()
    if args.near_miss is not None:
        raise UsageError("--near-miss runs with --via probe only")
    if args.random is not None:
        seed = _draws_seed(args)
        log(f"random draws through ttft diagnose: seed {seed}, draws {args.draw}..{args.draw + args.random - 1}")
        cases = draws_via_diagnose(seed, range(args.draw, args.draw + args.random), out / f"diagnose-random-{seed}",
                                   cal, args.budget, log)
        title = f"random draws through ttft diagnose (client only): seed {seed}, {len(cases)} draws"
    else:
        cases = scenarios_via_diagnose(_pick(args.names, args.fast), out / "diagnose", cal, args.budget, log)
        title = f"scenarios through ttft diagnose (client only): {len(cases)} scenarios"
    rep = ViaDiagnoseReport(cases, title, wall_s=time.monotonic() - t0, extra={"calibration": cal.to_dict()})
    if args.json:
        json.dump(rep.to_dict(), sys.stdout, indent=2, default=str)
        print()
    else:
        print(rep.format_text())
    return 0 if all(c.ok() for c in rep.scored()) else 1


def _draws_seed(args: argparse.Namespace) -> int:
    """``--random N`` / ``--near-miss M`` checked (each >= 1 when given, ``--draw`` >= 0, no NAME or
    --fast); the seed (given, or a fresh one)."""
    import random

    if (args.random is not None and args.random < 1) or (args.near_miss is not None and args.near_miss < 1) \
            or args.draw < 0:
        raise UsageError("--random and --near-miss must be >= 1, --draw >= 0")
    if args.names or args.fast:
        raise UsageError("--random draws its own scenarios: no NAME or --fast with it")
    return args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)


def _check_random(args: argparse.Namespace, cal: Calibration, log: Callable[[str], None]) -> int:
    """``check --random N`` and/or ``--near-miss M``: draws of one seed, scored per mode; 0 when none missed."""
    from diag.analysis.scenarios.random_matrix import RandomResult, check_random

    if args.repeat < 1:
        raise UsageError("--repeat must be >= 1")
    seed = _draws_seed(args)
    modes = {"server": ("server",), "client": ("client-only",), "both": ("server", "client-only")}[args.mode]
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    cal_file = args.calibration or str(out / "calibration.json")
    if not args.calibration:  # the reproduce commands reuse this run's calibration
        Path(cal_file).write_text(json.dumps(cal.to_dict(), indent=2))
    t0 = time.monotonic()
    results = []
    for space, n in (("main", args.random), ("near-miss", args.near_miss)):
        if n is None:
            continue
        log(f"random draws ({space} space): seed {seed}, draws {args.draw}..{args.draw + n - 1}, repeat {args.repeat}")
        results += check_random(seed, range(args.draw, args.draw + n), out / f"random-{seed}", cal, modes=modes,
                                repeat=args.repeat, log=log, space=space)
    res = RandomResult(seed, cal, modes, results, mode_arg=args.mode, calibration_file=cal_file,
                       wall_s=time.monotonic() - t0)
    if args.json:
        json.dump(res.to_dict(), sys.stdout, indent=2, default=str)
        print()
    else:
        print(res.format_text())
    return 0 if not res.misses() else 1
