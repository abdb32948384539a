"""Programs the `unsaturated` similarity study compiles, per stage, on a 4-model digits zoo (cache off).

    python -m benchmarks.study_programs ROOT     # trains the zoo under ROOT/zoo/gran4 if absent (about 30 s)

The zoo: digits, MLP 256x3 and the default CNN, seeds 0 and 1 (the default zoo's settings). The study runs
in this process with the persistent compilation cache off, and each program handed to XLA's backend is
counted through ``jax.monitoring`` (``runtime.compile_count``): in all, by name, and split where the study
logs the start of its stitching loop (before it: the grid, and the stitching stage's feature extraction and
coarse heads; after it: the stitchers' training and evaluation). The compile budget allows at most 80 for the whole study. Prints JSON.
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import time

import jax

ZOO = {"base": "default", "name": "gran4", "datasets": [{"name": "digits"}],
       "models": [{"name": "mlp_wide", "arch": "mlp", "kwargs": {"widths": [256, 256, 256]}},
                  {"name": "cnn", "arch": "cnn", "kwargs": {"channels": [16, 32, 64]}}]}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", help="results folder (the zoo is trained there if absent; the study's run is new)")
    ap.add_argument("--run", default=f"programs-{int(time.time())}", help="the study's run name (a new one)")
    args = ap.parse_args(argv)
    jax.config.update("jax_enable_compilation_cache", False)
    from funsim.experiments import similarity_study as S
    from funsim.experiments import zoo as zoo_lib
    from funsim.runtime.compile_count import CompileCounter

    root = pathlib.Path(args.root)
    if not (root / "zoo" / "gran4" / "zoo.json").is_file():
        zoo_lib.run(zoo_lib.config_from_dict(ZOO), root=root, progress=False, log=lambda s: None)
    marks = {}  # the count when the study logs its stitching stage's start: the grid's programs before it

    def log(msg: str) -> None:
        if "task-loss stitching" in msg and "stitching" not in marks:
            marks["stitching"] = total.count

    t0 = time.time()
    with CompileCounter() as total:
        S.run(S.config_from_dict({"base": "unsaturated", "zoo": "gran4", "name": args.run}), root=root,
              progress=False, log=log)
    grid = marks.get("stitching", total.count)
    result = {"programs": total.count, "before_stitching_loop": grid, "stitching_loop": total.count - grid,
              "wall_seconds": round(time.time() - t0, 1), "names": collections.Counter(total.names).most_common()}
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
