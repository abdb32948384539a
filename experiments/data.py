"""The data loaders' former home: ``funsim.experiments.data`` is :mod:`funsim.data`.

The loaders are library code (they import nothing of funsim and no JAX), so they live in their
own package; this name keeps working for code written against it.
"""

import sys

from funsim import data

sys.modules[__name__] = data
