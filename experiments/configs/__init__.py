"""The drivers' arguments modules: each driver's config, named configs and ``add_arguments``.

One module per ``funsim`` subcommand (``configs.grokking`` for ``funsim grokking``). None of them
imports JAX, flax or matplotlib, so ``funsim COMMAND --help`` answers at once; the driver's run
module (``funsim.experiments.grokking``) imports these names and does the work.
"""
