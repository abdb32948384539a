"""funsim.experiments: data loading, thin drivers, plotting and the CLI."""

from funsim.experiments.compile_cache import enable_compile_cache as enable_compile_cache  # noqa: E402,F401
