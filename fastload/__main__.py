"""``python -m fastload``: benchmark the loader on this machine, or check it.

    python -m fastload bench [--workloads rows,jpeg | --all] [--workers 0,2] [--json F] [--plot F.png]
    python -m fastload doctor [--json]
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Sequence

from fastload._bench.contenders import CONTENDERS
from fastload._bench.runner import DEFAULT_DURATION, DEFAULT_REPEATS, DEFAULT_WORKERS, DEFAULT_WORKLOADS
from fastload._bench.workloads import WORKLOADS

# Exit codes: a measurement failed; the command line asked for the impossible.
EXIT_FAILED = 1
EXIT_USAGE = 2


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def _counts(text: str) -> list[int]:
    try:
        return [int(n) for n in _names(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fastload", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    bench = commands.add_parser(
        "bench", help="compare fastload with torch and a pure-Python loader on generated data",
        description="Run synthetic and real-data workloads through fastload, a pure-Python "
                    "multiprocessing "
                    "baseline and torch's DataLoader (when installed), each measurement in a "
                    "fresh process, and print samples/s, MB/s, time to first batch and ratios. "
                    "Workloads: " + "; ".join(f"{w.name}: {w.description}, batch {w.batch_size}"
                                              for w in WORKLOADS.values()) + ".")
    bench.add_argument("--workloads", type=_names, default=list(DEFAULT_WORKLOADS),
                       help=f"comma-separated, of {','.join(WORKLOADS)} "
                            f"(default {','.join(DEFAULT_WORKLOADS)}; those a workload needs and "
                            "that are not installed are named and skipped)")
    bench.add_argument("--all", action="store_true", help="every workload (several minutes)")
    bench.add_argument("--contenders", type=_names, default=list(CONTENDERS),
                       help=f"comma-separated, of {','.join(CONTENDERS)} (default all)")
    bench.add_argument("--workers", type=_counts, default=list(DEFAULT_WORKERS),
                       help="comma-separated numbers of worker processes "
                            f"(default {','.join(map(str, DEFAULT_WORKERS))})")
    bench.add_argument("--batch-size", type=int, default=None,
                       help="override every workload's batch size")
    bench.add_argument("--duration", type=float, default=DEFAULT_DURATION,
                       help=f"seconds of loading per measurement (default {DEFAULT_DURATION:g})")
    bench.add_argument("--repeats", type=int, default=DEFAULT_REPEATS,
                       help="repeats of the whole matrix; medians are reported "
                            f"(default {DEFAULT_REPEATS})")
    bench.add_argument("--epochs", action="store_true",
                       help="also time later epochs' first batches, back to back and with the "
                            "loop stepping (whole epochs: minutes)")
    bench.add_argument("--no-memory", action="store_true",
                       help="do not sample the peak memory (PSS) of each measurement")
    bench.add_argument("--json", metavar="FILE", help="write every number to FILE as JSON")
    bench.add_argument("--plot", metavar="FILE.png",
                       help="draw a bar chart of samples/s (needs matplotlib)")
    bench.add_argument("--quiet", action="store_true", help="no progress bar")
    doctor = commands.add_parser(
        "doctor", help="check what decides fastload's speed and safety on this machine")
    doctor.add_argument("--json", action="store_true", help="print the checks as JSON")
    return parser


def _bench(args: argparse.Namespace) -> int:
    from fastload._bench import report, runner

    if args.plot and importlib.util.find_spec("matplotlib") is None:
        print("--plot needs matplotlib, which is not installed: "
              "pip install 'fastload[plot]' (or pip install matplotlib)", file=sys.stderr)
        return EXIT_USAGE
    try:
        plan = runner.Plan(workloads=list(WORKLOADS) if args.all else args.workloads,
                           contenders=args.contenders,
                           workers=args.workers, duration=args.duration, repeats=args.repeats,
                           memory=not args.no_memory, batch_size=args.batch_size,
                           epochs=args.epochs)
    except ValueError as exc:
        print(f"python -m fastload bench: {exc}", file=sys.stderr)
        return EXIT_USAGE
    outcome = runner.run(plan, progress=None if args.quiet else report.ProgressBar())
    print(report.table(outcome))
    if args.json:
        report.write_json(outcome, args.json)
    if args.plot and outcome.measurements:
        report.plot(outcome, args.plot)
    return EXIT_FAILED if outcome.failures else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default sys.argv[1:]); the exit code."""
    args = _parser().parse_args(argv)
    if args.command == "bench":
        return _bench(args)
    from fastload import _doctor

    return _doctor.main(as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
