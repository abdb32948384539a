"""JAX's persistent compilation cache for the ``funsim`` command line: on by default.

Most of a first run's time on a CPU is XLA compiling programs; a second run of
the same command loads them from disk instead. The cache lives under the user's
cache directory, ``$XDG_CACHE_HOME/funsim/jax`` (default ``~/.cache/funsim/jax``),
and is safe to delete at any time.

Where it goes, in order of precedence:

1. ``funsim --no-compile-cache ...`` (or the option after the subcommand): off.
2. ``FUNSIM_COMPILE_CACHE=off`` (also ``0``, ``false``, ``no``, ``none``): off;
   ``FUNSIM_COMPILE_CACHE=<dir>``: that directory.
3. A cache directory already given to JAX (``JAX_COMPILATION_CACHE_DIR``, or
   ``jax.config`` in this process) is kept as it is.
4. Otherwise the user's cache directory above.

Every program is cached, however fast it compiled (JAX's default threshold of
one second would skip most of them here), unless
``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`` is set. Reading a cached
program makes jaxlib's C++ loader log a warning and two errors per program
(``Assume version compatibility``; tuning features such as ``prefer-no-gather``
"not supported on the host"); they are harmless, so with the cache on, XLA's
C++ log is limited to fatal messages (``TF_CPP_MIN_LOG_LEVEL=3``) unless the
user set that variable. jaxlib reads it only when it loads, so :func:`enable`
must run before ``jax`` is first imported to silence them.

This module imports nothing heavy: ``funsim --help`` stays fast.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

__all__ = ["OPTION", "ENV", "add_option", "default_dir", "resolve", "enable", "enable_compile_cache"]

OPTION = "--no-compile-cache"
ENV = "FUNSIM_COMPILE_CACHE"
_OFF = {"off", "0", "false", "no", "none"}


def add_option(parser: argparse.ArgumentParser, *, subcommand: bool = False) -> None:
    """Add ``--no-compile-cache`` to ``parser`` (``subcommand=True``: leaves the top level's value alone)."""
    kw = {"default": argparse.SUPPRESS} if subcommand else {"default": False}
    parser.add_argument(OPTION, dest="no_compile_cache", action="store_true",
                        help=f"do not use JAX's persistent compilation cache (default: on, in {default_dir()}; "
                             f"{ENV}=off|<dir> turns it off or moves it)", **kw)


def default_dir(environ: dict | None = None) -> pathlib.Path:
    """``$XDG_CACHE_HOME/funsim/jax``, or ``~/.cache/funsim/jax``."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "funsim" / "jax"


def resolve(argv: list[str] | None = None, environ: dict | None = None) -> tuple[str, pathlib.Path | None]:
    """What :func:`enable` would do: ``("off" | "env" | "jax" | "default", directory or None)``.

    ``"jax"`` means a directory JAX was already given (kept as it is).

    Examples:
      >>> resolve(["quickstart", "--no-compile-cache"], {})
      ('off', None)
      >>> resolve([], {"FUNSIM_COMPILE_CACHE": "/tmp/c"})
      ('env', PosixPath('/tmp/c'))
      >>> resolve([], {"XDG_CACHE_HOME": "/x"})
      ('default', PosixPath('/x/funsim/jax'))
    """
    env = os.environ if environ is None else environ
    if OPTION in (argv or []):
        return "off", None
    value = env.get(ENV, "").strip()
    if value.lower() in _OFF:
        return "off", None
    if value:
        return "env", pathlib.Path(value).expanduser()
    given = env.get("JAX_COMPILATION_CACHE_DIR")
    if not given and environ is None and "jax" in sys.modules:
        given = sys.modules["jax"].config.jax_compilation_cache_dir
    if given:
        return "jax", pathlib.Path(given)
    return "default", default_dir(env)


def enable(argv: list[str] | None = None) -> pathlib.Path | None:
    """Turn the persistent compilation cache on (or off) for this process; returns its directory or None.

    Call it before ``jax`` is imported: the settings go into the environment
    (``JAX_COMPILATION_CACHE_DIR``, ...), which JAX reads when it loads; if
    ``jax`` is already imported they also go to ``jax.config``.
    """
    how, path = resolve(argv)
    jax = sys.modules.get("jax")
    if how == "off":
        os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"
        if jax is not None:
            jax.config.update("jax_enable_compilation_cache", False)
        return None
    if how != "jax":
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            print(f"funsim: not caching compiled programs: cannot create {path} ({e.strerror}). "
                  f"Set {ENV}=<a writable directory>, or {ENV}=off.", file=sys.stderr)
            return None
        os.environ["JAX_COMPILATION_CACHE_DIR"] = str(path)
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if jax is not None:
        jax.config.update("jax_enable_compilation_cache", True)
        jax.config.update("jax_compilation_cache_dir", str(path))
        jax.config.update("jax_persistent_cache_min_compile_time_secs",
                          float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))
    return path


def enable_compile_cache(path: str | os.PathLike | None = None) -> pathlib.Path | None:
    """Turn JAX's persistent compilation cache on for this process: the one-line switch for library users.

    ``funsim.similarity`` compiles a handful of programs per batch (see
    :func:`similarity.compare_grid`); with the cache on, a later process loads them from disk
    instead of compiling them again. The command line does this by default.

    Args:
      path: the cache directory; default ``FUNSIM_COMPILE_CACHE`` if set (``off`` turns the cache
        off), else a directory already given to JAX, else ``~/.cache/funsim/jax``
        (``$XDG_CACHE_HOME/funsim/jax``).

    Returns:
      The directory, or None when the cache is off.

    Examples:
      >>> from funsim.runtime import enable_compile_cache
      >>> enable_compile_cache("/tmp/funsim-doc-cache").name  # before or after importing jax
      'funsim-doc-cache'
    """
    if path is None:
        return enable()
    path = pathlib.Path(path).expanduser()
    saved = os.environ.get(ENV)
    os.environ[ENV] = str(path)
    try:
        return enable()
    finally:
        if saved is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = saved
