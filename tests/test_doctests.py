"""Every docstring example in the installed ``funsim`` packages runs as written.

The modules are imported under their installed names (``funsim.similarity.cka``, ...),
so the doctests see the same module objects as the rest of the suite, never a second
copy imported by file path.
"""

import doctest
import importlib
import pkgutil

import pytest

import funsim.data
import funsim.experiments
import funsim.models
import funsim.runtime
import funsim.similarity

#: a former name of another module (``funsim.experiments.data`` is ``funsim.data``): tested under its own name
ALIASES = {"funsim.experiments.data"}


def _modules() -> list[str]:
    names = [funsim.data.__name__]
    for pkg in (funsim.similarity, funsim.runtime, funsim.models, funsim.experiments):
        names.append(pkg.__name__)
        names += [m.name for m in pkgutil.iter_modules(pkg.__path__, pkg.__name__ + ".")]
    return sorted(set(names) - ALIASES)


def test_the_aliases_are_other_modules():
    for name in ALIASES:
        assert importlib.import_module(name).__name__ != name


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(module, name):
        runner.run(test)
    failed, attempted = runner.summarize(verbose=False)
    assert failed == 0, f"{failed} of {attempted} doctest examples failed in {name} (output above)"
