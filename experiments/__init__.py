"""funsim.experiments: thin drivers (one per experiment), their configs, plotting and the CLI.

``enable_compile_cache`` is :func:`funsim.runtime.enable_compile_cache`, re-exported here where it was first.
"""

from funsim.runtime.compile_cache import enable_compile_cache as enable_compile_cache  # noqa: F401
