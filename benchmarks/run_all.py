"""Run every benchmark in one process and write a new dated record ``benchmarks/results/<date>-<host>.md``.

Usage::

    python -m benchmarks.run_all            # full sizes: writes benchmarks/results/<date>-<host>.md
    python -m benchmarks.run_all --quick    # tiny sizes, a smoke run: printed, nothing written
    python -m benchmarks.run_all --only cka tensor

Each ``benchmarks/bench_<topic>.py`` exposes ``main(argv) -> str`` returning a
Markdown section. A run never overwrites a file: a second run on the same day and
host gets ``<date>-<host>-2.md``, and so on. ``benchmarks/RESULTS.md`` is the
hand-kept table of current numbers; this script never edits it (copy a new number
there by hand, with a link to its dated file).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import os
import pkgutil
import platform
import re
import socket
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS_DIR = HERE / "results"


def discover() -> list[str]:
    return sorted(
        m.name[len("bench_"):]
        for m in pkgutil.iter_modules([str(HERE)])
        if m.name.startswith("bench_")
    )


def machine_line() -> str:
    import jax

    dev = jax.devices()[0]
    kind = getattr(dev, "device_kind", dev.platform)
    return (
        f"{platform.machine()} {platform.system()}, {os.cpu_count()} CPU cores, "
        f"JAX {jax.__version__} on {dev.platform} ({kind}, {jax.device_count()} device(s)), "
        f"Python {platform.python_version()}"
    )


def load(topic: str):
    """The benchmark module ``benchmarks.bench_<topic>``."""
    return importlib.import_module(f"benchmarks.bench_{topic}")


def host_name() -> str:
    """This machine's name, reduced to letters, digits and dashes (for a file name)."""
    return re.sub(r"[^A-Za-z0-9-]+", "-", socket.gethostname().split(".")[0]).strip("-") or "host"


def write_record(text: str, directory: Path, *, date: str | None = None, host: str | None = None) -> Path:
    """Write ``text`` to a new file ``directory/<date>-<host>[-k].md`` and return its path.

    ``date`` defaults to today (UTC, ISO), ``host`` to :func:`host_name`. An existing
    file is never replaced: the first free name of ``<stem>.md``, ``<stem>-2.md``,
    ``<stem>-3.md``, ... is created exclusively (so two runs at once cannot collide).
    """
    stem = f"{date or datetime.datetime.now(datetime.timezone.utc).date().isoformat()}-{host or host_name()}"
    directory.mkdir(parents=True, exist_ok=True)
    for k in range(1, 10_000):
        path = directory / (f"{stem}.md" if k == 1 else f"{stem}-{k}.md")
        try:
            with open(path, "x") as f:
                f.write(text)
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"{directory} already holds 9,999 records named {stem}*.md; move some away.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke run)")
    parser.add_argument("--only", nargs="*", default=None, help=f"topics, from {discover()}")
    parser.add_argument("--results-dir", type=Path, default=None,
                        help="where the dated record goes (default benchmarks/results; "
                             "with --quick, nothing is written unless this is given)")
    args = parser.parse_args(argv)
    topics = args.only or discover()
    unknown = sorted(set(topics) - set(discover()))
    if unknown:
        parser.error(f"unknown topics {unknown}; available: {discover()}")
    cmd = "python -m benchmarks.run_all" + (" --quick" if args.quick else "")
    if args.only:
        cmd += " --only " + " ".join(topics)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    sections, failed = [], []
    for topic in topics:
        t0 = time.perf_counter()
        print(f"== benchmarks.bench_{topic}", flush=True)
        try:
            text = load(topic).main(["--quick"] if args.quick else [])
        except Exception as e:  # recorded, and the run goes on to the next benchmark
            failed.append(topic)
            text = f"**bench_{topic} failed**: {type(e).__name__}: {e}"
            print(text, file=sys.stderr, flush=True)
        sections.append(f"{text.rstrip()}\n\n_(bench_{topic}: {time.perf_counter() - t0:.0f} s wall)_\n")
    header = (
        "# Benchmark results\n\n"
        f"Produced by `{cmd}` (`make bench` runs it) on {stamp}.\n\n"
        f"Machine: {machine_line()}.\n\n"
        "Ratios are reference time / funsim time (higher means funsim is faster). Steady-state times "
        "are medians of warm calls; compile time is reported separately.\n\n"
    )
    text = header + "\n".join(sections)
    if args.quick and args.results_dir is None:
        print(text)
        print("(--quick: a smoke run, no record written)")
    else:
        path = write_record(text, args.results_dir or RESULTS_DIR)
        print(f"wrote {path} (benchmarks/RESULTS.md is hand-kept: copy what changed there)")
    if failed:
        print(f"failed: {', '.join(failed)} (their sections say why)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
