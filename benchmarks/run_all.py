"""Run every benchmark in one process and rewrite ``benchmarks/RESULTS.md``.

Usage::

    python -m benchmarks.run_all            # full sizes (what RESULTS.md records)
    python -m benchmarks.run_all --quick    # tiny sizes, a smoke run in seconds
    python -m benchmarks.run_all --only cka tensor

Each ``benchmarks/bench_<topic>.py`` exposes ``main(argv) -> str`` returning a
Markdown section. The results file is written atomically.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import os
import pkgutil
import platform
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


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


def atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke run)")
    parser.add_argument("--only", nargs="*", default=None, help=f"topics, from {discover()}")
    parser.add_argument("--output", type=Path, default=HERE / "RESULTS.md")
    args = parser.parse_args(argv)
    topics = args.only or discover()
    unknown = sorted(set(topics) - set(discover()))
    if unknown:
        parser.error(f"unknown topics {unknown}; available: {discover()}")
    cmd = "python -m benchmarks.run_all" + (" --quick" if args.quick else "")
    if args.only:
        cmd += " --only " + " ".join(topics)
    sections = []
    for topic in topics:
        mod = importlib.import_module(f"benchmarks.bench_{topic}")
        t0 = time.perf_counter()
        print(f"== benchmarks.bench_{topic}", flush=True)
        text = mod.main(["--quick"] if args.quick else [])
        sections.append(f"{text.rstrip()}\n\n_(bench_{topic}: {time.perf_counter() - t0:.0f} s wall)_\n")
    header = (
        "# Benchmark results\n\n"
        f"Produced by `{cmd}` (`make bench` runs it) on {datetime.date.today().isoformat()}.\n\n"
        f"Machine: {machine_line()}.\n\n"
        "Ratios are reference time / funsim time (higher means funsim is faster). Steady-state times "
        "are medians of warm calls; compile time is reported separately.\n\n"
    )
    if args.quick and args.output == HERE / "RESULTS.md":
        print(header + "\n".join(sections))
        print("(--quick: RESULTS.md left unchanged)")
        return 0
    atomic_write(args.output, header + "\n".join(sections))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
