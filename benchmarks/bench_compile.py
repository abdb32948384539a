"""Cold and warm calls of the batched entry points: first call (compiling) against second call, and how
many programs each compiles.

Run::

    python -m benchmarks.bench_compile                  # full sizes (the study-like grid too)
    python -m benchmarks.bench_compile --size small     # the study-like grid at a CPU-friendly size
    python -m benchmarks.bench_compile --quick          # tiny sizes, seconds (a smoke run)
    python -m benchmarks.bench_compile --only fit_mixed grid_six

Every workload runs in a fresh Python process with JAX's persistent compilation cache off
(``JAX_ENABLE_COMPILATION_CACHE=false``, ``FUNSIM_COMPILE_CACHE=off``), so its first call compiles
everything it needs. The process builds its inputs with NumPy, places them on the default device
(not timed), then calls the public function twice: the first call's wall time (compile and run),
the second call's (run only, warm), their ratio (each call starts after ``gc.collect()``, so that
neither pays for a full collection of the garbage the imports left: one such collection took 23-56 ms
here, a sixth of a small grid's first call; the seconds the collector ran inside each call are
recorded, ``gc_s_first`` and ``gc_s_second``), and the programs handed to the backend during each
call (``funsim.runtime.compile_count.CompileCounter``: jax.monitoring's backend-compile events) with the
seconds those compilations took. A warm call that compiles anything is a bug (a shape or a Python
value reaching a trace). Only public APIs are called: ``similarity.fit_stitchers`` and
``similarity.compare_grid``.

Workloads (float32):

* ``fit_mixed``: ``fit_stitchers``, 64 affine problems, each side's width drawn from 32/64/128/256,
  n = 2,000;
* ``fit_same``: ``fit_stitchers``, 4 affine problems of one shape, (2,000 x 256) to (2,000 x 256);
* ``grid_cka``: ``compare_grid`` of 8 x 8 layers (two of each width 64/96/128/200 per side),
  n = 1,000, ``cka/linear`` alone;
* ``grid_six``: the same grid with six measures (``cka/linear``, ``rsa/correlation/pearson``,
  ``svcca``, ``stitch/orthogonal``, ``stitch/scaled_orthogonal``, ``stitch/affine``);
* ``study``: a study-like grid of 24 x 24 layers (six of each width 32/100/256/512 per side),
  the six measures, n = 5,000 (``--size small``: n = 1,000).

The warm kernels against NumPy are the other benchmarks' (``bench_cka --ratios-only``,
``bench_grid --only cka``, ``bench_rsa``); they are not repeated here.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SIX = ["cka/linear", "rsa/correlation/pearson", "svcca", "stitch/orthogonal", "stitch/scaled_orthogonal",
       "stitch/affine"]

#: name -> (what it is, measures or family, full sizes, --size small sizes, --quick sizes); sizes are
#: (count, n, widths) with count the number of problems (fits) or of layers per side (grids).
WORKLOADS = {
    "fit_mixed": ("fit_stitchers, mixed widths", "affine",
                  (64, 2000, (32, 64, 128, 256)), None, (8, 200, (8, 16, 32))),
    "fit_same": ("fit_stitchers, one shape", "affine",
                 (4, 2000, (256,)), None, (2, 200, (16,))),
    "grid_cka": ("compare_grid", ["cka/linear"],
                 (8, 1000, (64, 96, 128, 200)), None, (4, 100, (8, 12))),
    "grid_six": ("compare_grid", SIX,
                 (8, 1000, (64, 96, 128, 200)), None, (4, 100, (8, 12))),
    "study": ("compare_grid, study-like", SIX,
              (24, 5000, (32, 100, 256, 512)), (24, 1000, (32, 100, 256, 512)), (8, 100, (8, 12, 16, 20))),
    # the same grid with every layer of a side in one padded group (the shape policy's other choice)
    "study_1g": ("compare_grid, study-like, one width group per side", SIX,
                 (24, 5000, (32, 100, 256, 512)), (24, 1000, (32, 100, 256, 512)), (8, 100, (8, 12, 16, 20))),
}


def _sizes(name: str, size: str, quick: bool):
    _, _, full, small, tiny = WORKLOADS[name]
    if quick:
        return tiny
    return small if (size == "small" and small is not None) else full


# ------------------------------------------------------------------------------------ the child


def _fit_inputs(count, n, widths):
    import numpy as np

    r = np.random.default_rng(0)
    xs, ys = [], []
    for _ in range(count):
        d1, d2 = (widths[0], widths[0]) if len(widths) == 1 else (r.choice(widths), r.choice(widths))
        x = r.normal(size=(n, d1)).astype(np.float32)
        ys.append((x @ r.normal(size=(d1, d2)) + r.normal(size=(n, d2))).astype(np.float32))
        xs.append(x)
    return xs, ys


def _grid_inputs(count, n, widths):
    """Two models' layers: ``count`` per side, the widths in turn (``count / len(widths)`` of each)."""
    import numpy as np

    r = np.random.default_rng(1)
    base = r.normal(size=(n, 64)).astype(np.float32)
    a, b = {}, {}
    for i in range(count):
        w = widths[i % len(widths)]
        a[f"a{i}"] = np.tanh(base @ r.normal(size=(64, w)) / 8).astype(np.float32)
        b[f"b{i}"] = (np.maximum(base @ r.normal(size=(64, w)) / 8, 0.0)
                      + 0.1 * r.normal(size=(n, w))).astype(np.float32)
    return a, b


class _GcClock:
    """Seconds the garbage collector ran inside the ``with`` block (``gc.callbacks``)."""

    def __enter__(self):
        self.seconds, self._t0 = 0.0, None
        gc.callbacks.append(self._cb)
        return self

    def _cb(self, phase, info):
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self._t0 is not None:
            self.seconds += time.perf_counter() - self._t0

    def __exit__(self, *exc):
        gc.callbacks.remove(self._cb)


def _child(name: str, size: str, quick: bool) -> dict:
    import jax

    from funsim import similarity
    from funsim.runtime.compile_count import CompileCounter

    count, n, widths = _sizes(name, size, quick)
    _, spec, *_ = WORKLOADS[name]
    if name.startswith("fit"):
        xs, ys = _fit_inputs(count, n, widths)
        xs, ys = jax.device_put(xs), jax.device_put(ys)
        call = lambda: similarity.fit_stitchers(xs, ys, family=spec)  # noqa: E731
    else:
        if name.endswith("_1g"):  # one padded width group per side, whatever the widths
            from funsim.similarity.grid import layers

            layers.MAX_GROUPS = 1
        a, b = _grid_inputs(count, n, widths)
        a, b = jax.device_put(a), jax.device_put(b)
        call = lambda: similarity.compare_grid(a, b, measures=spec).tables  # noqa: E731
    jax.block_until_ready((xs, ys) if name.startswith("fit") else (a, b))
    out = {}
    for which in ("first", "second"):
        gc.collect()  # neither call pays for a collection of garbage made before it (import, inputs)
        with CompileCounter() as c, _GcClock() as g:
            t0 = time.perf_counter()
            jax.block_until_ready(call())
            out[which] = time.perf_counter() - t0
        out[f"gc_s_{which}"] = g.seconds
        out[f"programs_{which}"] = c.count
        out[f"compile_s_{which}"] = c.seconds
    dev = jax.devices()[0]
    out.update(sizes=[count, n, list(widths)], jax=jax.__version__, backend=dev.platform,
               device=getattr(dev, "device_kind", dev.platform), n_devices=jax.device_count())
    return out


# ----------------------------------------------------------------------------------- the parent


def _cold_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env.update(JAX_ENABLE_COMPILATION_CACHE="false", FUNSIM_COMPILE_CACHE="off", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def _run_child(name: str, size: str, quick: bool, timeout: float) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.bench_compile", "--child", name, "--size", size]
    if quick:
        cmd.append("--quick")
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=ROOT, env=_cold_env(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        tail = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"error": f"exit {p.returncode}: {tail[:200]}"}
    res = json.loads(lines[-1][len("RESULT "):])
    res["process_s"] = time.perf_counter() - t0
    return res


def _say(msg: str) -> None:
    print(f"[bench_compile {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _what(name: str, sizes) -> str:
    kind, spec, *_ = WORKLOADS[name]
    count, n, widths = sizes
    if name.startswith("fit"):
        shape = f"{count} problems" if len(widths) > 1 else f"{count} problems of ({n} x {widths[0]})"
        return f"{kind}: {shape}, {spec}, widths {'/'.join(map(str, widths))}, n = {n:,}"
    ms = "cka/linear" if len(spec) == 1 else f"{len(spec)} measures"
    return f"{kind}: {count} x {count} layers, widths {'/'.join(map(str, widths))}, n = {n:,}, {ms}"


def table(results: dict, command: str) -> str:
    meta = next((r for r in results.values() if "error" not in r), {})
    head = [
        "**Cold and warm calls: compiled programs per workload**",
        "",
        f"Command: `{command}`; {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}; host {platform.node()} "
        f"({platform.machine()}, {os.cpu_count()} CPU cores, load average "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}); JAX {meta.get('jax', '?')}, backend "
        f"{meta.get('backend', '?')} ({meta.get('device', '?')}, {meta.get('n_devices', '?')} device(s)). "
        "Each workload in a fresh process, persistent compilation cache off; float32.",
        "",
        "| workload | first call (s) | second call (s) | first / second | programs compiled (first call) "
        "| compiling (s, first call) | programs compiled (second call) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    rows = []
    for name, r in results.items():
        if "error" in r:
            rows.append(f"| `{name}` | {r['error']} | | | | | |")
            continue
        ratio = r["first"] / r["second"] if r["second"] > 0 else float("inf")
        rows.append(
            f"| `{name}`: {_what(name, r['sizes'])} | {r['first']:.2f} | {r['second']:.3f} | {ratio:,.0f}x "
            f"| {r['programs_first']} | {r['compile_s_first']:.1f} | {r['programs_second']} |"
        )
    return "\n".join(head + rows)


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run)")
    ap.add_argument("--size", choices=("small", "full"), default="full", help="the study-like grid's size")
    ap.add_argument("--only", nargs="*", choices=sorted(WORKLOADS), default=None, help="some workloads")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per workload's process")
    ap.add_argument("--output", type=Path, default=None,
                    help="also write the table to this file (rewritten after each workload)")
    ap.add_argument("--child", choices=sorted(WORKLOADS), default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(_child(args.child, args.size, args.quick)), flush=True)
        return ""
    names = args.only or list(WORKLOADS)
    command = "python -m benchmarks.bench_compile" + (" --quick" if args.quick else "") + \
        (f" --size {args.size}" if args.size != "full" else "") + (f" --only {' '.join(names)}" if args.only else "")
    results = {}
    for name in names:
        _say(f"{name}: {_what(name, _sizes(name, args.size, args.quick))}")
        results[name] = r = _run_child(name, args.size, args.quick, args.timeout)
        done = r.get("error") or f"first {r['first']:.2f} s, second {r['second']:.3f} s, {r['programs_first']} programs"
        _say(f"{name}: {done}")
        if args.output is not None:  # after each workload: a run cut short keeps the rows it has
            args.output.write_text(table(results, command) + "\n")
    text = table(results, command)
    print(text)
    return text


if __name__ == "__main__":
    main()
