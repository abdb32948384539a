"""funsim.runtime: the JAX process around the measures, for the library's users and the drivers alike.

* :mod:`~funsim.runtime.distributed`: join a multi-process run (``initialize``), who does what
  (``my_units``), one global array from each process's rows (``rows_across_processes``);
* :mod:`~funsim.runtime.processes`: the run's environment variables and timeouts (no JAX);
* :mod:`~funsim.runtime.launcher`: N local processes of one run (``funsim launch``; no JAX);
* :mod:`~funsim.runtime.locks`: a folder locked for one writing run (``run.lock``; no JAX);
* :mod:`~funsim.runtime.compile_cache`: JAX's persistent compilation cache, one call to turn it on;
* :mod:`~funsim.runtime.compile_count`: count the XLA programs a call compiles;
* :mod:`~funsim.runtime.xla_flags`: the one XLA flag funsim sets, for small runs.

``funsim.similarity`` never touches the process; this package is where that is done. It imports
no other funsim package.
"""

from funsim.runtime.compile_cache import enable_compile_cache as enable_compile_cache  # noqa: F401
