"""The command line's persistent compilation cache: where it goes, how to turn it off, quiet cache hits.

Cache use is counted through ``jax.monitoring`` (JAX records an event for every program it looks up in
the persistent cache and for every hit), so the tests hold on any backend, not only XLA:CPU.
"""

import os
import pathlib
import subprocess
import sys
import textwrap

from funsim.experiments.cli import build_parser
from funsim.runtime import compile_cache

ROOT = pathlib.Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent(
    """
    import os, sys
    from funsim.runtime import compile_cache
    where = compile_cache.enable(sys.argv[1:])
    import jax, jax.numpy as jnp
    events = []
    jax.monitoring.register_event_listener(lambda event, **kw: events.append(event))
    print("DIR", where)
    print("VALUE", float(jax.jit(lambda x: jnp.sin(x) @ x.T)(jnp.ones((3, 3)))[0, 0]))
    print("LOOKUPS", events.count("/jax/compilation_cache/compile_requests_use_cache"))
    print("HITS", events.count("/jax/compilation_cache/cache_hits"))
    print("LOGLEVEL", os.environ.get("TF_CPP_MIN_LOG_LEVEL"))
    """
)

# what jaxlib's XLA:CPU loader logs for each program read from the cache (other backends log nothing)
LOADER_LINES = ("Assume version compatibility", "cpu_aot_loader")


def _run(tmp_path, *args, **env):
    base = {k: v for k, v in os.environ.items()
            if k not in ("JAX_COMPILATION_CACHE_DIR", "TF_CPP_MIN_LOG_LEVEL", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
                         "JAX_ENABLE_COMPILATION_CACHE", compile_cache.ENV)}
    full = {**base, "XDG_CACHE_HOME": str(tmp_path / "xdg"), **env}
    return subprocess.run([sys.executable, "-c", SCRIPT, *args], env=full, cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def _count(run, key: str) -> int:
    """The number the script printed after ``key``."""
    return int(run.stdout.split(f"{key} ")[1].split()[0])


def _entries(d: pathlib.Path) -> list[str]:
    return sorted(p.name for p in d.glob("*-cache")) if d.is_dir() else []


def test_on_by_default_under_the_user_cache_dir_and_quiet_when_it_hits(tmp_path):
    first = _run(tmp_path)
    assert first.returncode == 0, first.stderr
    cache = tmp_path / "xdg" / "funsim" / "jax"
    assert f"DIR {cache}" in first.stdout
    assert _count(first, "LOOKUPS") >= 1 and _count(first, "HITS") == 0, first.stdout
    assert _entries(cache), "nothing was cached"
    second = _run(tmp_path)
    assert second.returncode == 0, second.stderr
    assert first.stdout.split("VALUE")[1].split()[0] == second.stdout.split("VALUE")[1].split()[0]
    # the second run reads its programs back: every lookup hits
    assert _count(second, "HITS") == _count(second, "LOOKUPS") >= 1, second.stdout
    # a cache hit makes XLA:CPU's loader log "Assume version compatibility" and feature warnings: XLA's C++
    # log is limited to fatal messages, unless the user chose its level (kept, and the cache still hits)
    assert _count(second, "LOGLEVEL") == 3
    assert not any(line in second.stderr for line in LOADER_LINES), second.stderr
    loud = _run(tmp_path, TF_CPP_MIN_LOG_LEVEL="1")
    assert loud.returncode == 0 and _count(loud, "LOGLEVEL") == 1 and _count(loud, "HITS") >= 1, loud.stdout


def test_turned_off_or_moved(tmp_path):
    cache = tmp_path / "xdg" / "funsim" / "jax"
    off = _run(tmp_path, "--no-compile-cache")
    assert off.returncode == 0 and "DIR None" in off.stdout and not _entries(cache), off.stderr
    assert _count(off, "LOOKUPS") == 0 and _count(off, "HITS") == 0, off.stdout
    moved = _run(tmp_path, **{compile_cache.ENV: str(tmp_path / "elsewhere")})
    assert moved.returncode == 0 and _entries(tmp_path / "elsewhere") and not _entries(cache), moved.stderr
    assert _count(moved, "LOOKUPS") >= 1, moved.stdout


def test_resolve_precedence():
    env = {"XDG_CACHE_HOME": "/c", "JAX_COMPILATION_CACHE_DIR": "/j", compile_cache.ENV: "/f"}
    assert compile_cache.resolve(["zoo", "--no-compile-cache"], env) == ("off", None)
    assert compile_cache.resolve([], env) == ("env", pathlib.Path("/f"))
    assert compile_cache.resolve([], {**env, compile_cache.ENV: "OFF"}) == ("off", None)
    assert compile_cache.resolve([], {**env, compile_cache.ENV: ""}) == ("jax", pathlib.Path("/j"))
    assert compile_cache.resolve([], {"XDG_CACHE_HOME": "/c"}) == ("default", pathlib.Path("/c/funsim/jax"))
    home = compile_cache.resolve([], {})[1]
    assert home == pathlib.Path(os.path.expanduser("~")) / ".cache" / "funsim" / "jax"


def test_the_option_parses_before_and_after_the_subcommand():
    for argv in (["--no-compile-cache", "compare", "--example"], ["compare", "--example", "--no-compile-cache"]):
        assert build_parser("compare").parse_args(argv).no_compile_cache is True
    assert build_parser("compare").parse_args(["compare", "--example"]).no_compile_cache is False
