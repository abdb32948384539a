"""The whole similarity study through this tree against the same design through an older revision.

Run (from the repository root)::

    python -m benchmarks.study_before --zoo /path/to/results/zoo/default-md
    python -m benchmarks.study_before --zoo ... --models digits/mlp_narrow_s0,digits/cnn_s0 --rounds 2

Not a ``bench_<topic>`` module: ``run_all`` (``make bench``) leaves it out, as it takes two full study
runs (minutes each) and an older checkout. One run times ``funsim similarity-study`` (its ``run``: the zoo load, the grid stage and the
task-loss stitching stage) on a subset of a trained zoo, twice, each in a fresh subprocess:

* **now**: this tree (the installed ``funsim``);
* **before**: the tree at ``--before REV`` (default ``02ff8ac``, before the drivers work: eager
  model features, a Python loop of stitched evaluations, per-step training dispatch), unpacked
  with ``git archive`` under a temporary folder and imported through ``PYTHONPATH`` from a
  ``funsim/`` shim whose three subpackages point into it. Each child prints the file of the
  ``funsim`` it imported, so a wrong import shows.

**The subset.** ``--models`` (zoo model ids) of one data set, copied into a small zoo folder
with its own ``zoo.json``; training-config keys the old revision does not know (``sampling``,
at its default) are dropped from the copies, so both trees read the same checkpoints.

**The design.** ``CONFIGS["unsaturated"]`` of this tree restricted to the fields both
revisions' ``StudyConfig`` know (three task-loss families, ``stitch_layers="all"``, its
measures, ``stitch_steps``), ``stitch_train_rows`` 200 (the design's default; its digits override,
100, is fewer rows than some sources' features, which the old revision's orthogonal closed-form start
refuses: ``--stitch-train-rows 0`` takes the design's rows for the data set). Fields only this tree knows are set to what the old revision did implicitly
(``activation_point="post_activation"``, no extra conventions, no coarse head, no RSA width
limit), so both sides do the same work.

The compilation cache is off on both sides (``FUNSIM_COMPILE_CACHE=off``,
``JAX_ENABLE_COMPILATION_CACHE=false``): the ratio compares code, not cache. Reported per side:
wall time, the child's CPU time (user + sys, ``resource.getrusage(RUSAGE_CHILDREN)``), and each
stage's seconds from the study's own metrics; then the ratios, and a check that both sides
computed the same numbers on the rows they share (the grid's values, the task-loss accuracies).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import pathlib
import resource
import shutil
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
# Two architectures, both seeds (the study stacks the seeds' tails), convolutional only: with an MLP in
# the subset, flattened conv maps of up to 512 features become sources of its dense layers, more than
# the few stitching rows, which the old revision's orthogonal closed-form start refuses (this tree fits
# it on the rows' span).
DEFAULT_MODELS = ("digits/cnn_s0", "digits/cnn_s1", "digits/resnet8_s0", "digits/resnet8_s1")
# The unsaturated design's default stitching rows; its digits override (100) is below the 128 features
# of resnet8's block2_0, a source of the CNN's pool layer, for the old revision's orthogonal start.
DEFAULT_STITCH_ROWS = 200
# Fields of StudyConfig that the old revision knows too (02ff8ac).
SHARED_FIELDS = ("name", "zoo", "datasets", "n_rows", "flatten", "measures", "families", "affine_ridge", "split",
                 "seed", "stitch_families", "stitch_layers", "depth_tolerance", "stitch_steps",
                 "stitch_learning_rate", "stitch_batch_size", "stitch_train_rows", "coarse_groupings")
# This tree's fields that the old revision lacks, at the values that reproduce what it did.
NEW_ONLY = {"activation_point": "post_activation", "conventions": [], "coarse_head": False,
            "rsa_max_features": None, "stitch_train_rows_by_dataset": []}
# Keys of a model's train_config.json that the old revision's TrainConfig lacks, and their defaults here.
NEW_TRAIN_KEYS = {"sampling": "independent"}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--zoo", default="results/zoo/default",
                   help="a trained zoo's run directory (funsim zoo --config default)")
    p.add_argument("--models", default=",".join(DEFAULT_MODELS),
                   help="comma-separated zoo model ids, all of one data set")
    p.add_argument("--before", default="02ff8ac", help="the older revision (git rev)")
    p.add_argument("--design", default="unsaturated", help="this tree's CONFIGS entry to take the design from")
    p.add_argument("--stitch-train-rows", type=int, default=DEFAULT_STITCH_ROWS,
                   help="training rows of the stitchers (0: the design's rows for the data set)")
    p.add_argument("--stitch-steps", type=int, default=None, help="override the design's stitch_steps")
    p.add_argument("--rounds", type=int, default=1, help="alternating rounds (before, now, before, now, ...)")
    p.add_argument("--order", choices=("before-first", "now-first"), default="before-first")
    p.add_argument("--workdir", default=None, help="where the zoo subset, old tree and outputs go (default: a temp dir)")
    p.add_argument("--json", default=None, help="write the results here as JSON")
    p.add_argument("--from-results", metavar="WORKDIR", default=None,
                   help="run nothing: report the results a finished run left in WORKDIR")
    p.add_argument("--child", nargs=2, metavar=("SPEC", "RESULT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    if not models:
        p.error("--models is empty; give zoo model ids such as digits/cnn_s0,digits/cnn_s1.")
    if len({m.split("/", 1)[0] for m in models}) != 1 or any("/" not in m for m in models):
        p.error(f"--models must be '<data set>/<model>' ids of ONE data set, got {models}.")
    if args.rounds < 1:
        p.error(f"--rounds must be >= 1, got {args.rounds}.")
    args.models = models
    return args


# ----------------------------------------------------------------------------- set-up


def subset_zoo(zoo: pathlib.Path, models: list[str], dest: pathlib.Path) -> pathlib.Path:
    """A zoo folder holding only ``models`` (copies; train configs stripped of keys the old tree lacks)."""
    manifest = json.loads((zoo / "zoo.json").read_text())
    unknown = [m for m in models if m not in manifest["models"]]
    if unknown:
        raise SystemExit(f"--models {unknown} are not in {zoo / 'zoo.json'}; it has {list(manifest['models'])}.")
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    ds = manifest["models"][models[0]]["dataset"]
    manifest["models"] = {m: manifest["models"][m] for m in models}
    manifest["datasets"] = {ds: manifest["datasets"][ds]}
    for m, e in manifest["models"].items():
        shutil.copytree(zoo / e["workdir"], dest / e["workdir"])
        tc_path = dest / e["workdir"] / "train_config.json"
        tc = json.loads(tc_path.read_text())
        for k, default in NEW_TRAIN_KEYS.items():
            if tc["config"].get(k, default) != default:
                raise SystemExit(f"{m}: its train config has {k}={tc['config'][k]!r}; the old tree can only "
                                 f"read models trained with {k}={default!r}. Choose other --models.")
            tc["config"].pop(k, None)
        tc_path.write_text(json.dumps(tc, indent=2))
    manifest["complete"] = True
    manifest["note"] = f"benchmark subset of {zoo}: {', '.join(models)}"
    (dest / "zoo.json").write_text(json.dumps(manifest, indent=2))
    return dest


def old_tree(rev: str, dest: pathlib.Path) -> tuple[pathlib.Path, str]:
    """``git archive REV`` under ``dest/src``, and a ``dest/pkg/funsim`` shim: the PYTHONPATH entry and the commit."""
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{rev}^{{commit}}"],
                            capture_output=True, text=True, check=True).stdout.strip()
    src, pkg = dest / "src", dest / "pkg" / "funsim"
    for d in (src, pkg.parent):
        if d.exists():
            shutil.rmtree(d)
    src.mkdir(parents=True)
    pkg.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    for sub in ("similarity", "models", "experiments"):
        (pkg / sub).symlink_to(src / sub)
    (pkg / "__init__.py").write_text(f'"""funsim at {commit} (benchmark shim)."""\n')
    return pkg.parent, commit


def design(args, zoo_dir: pathlib.Path) -> dict:
    """The study config both sides run (JSON-able; lists for tuples)."""
    from funsim.experiments import similarity_study as S

    cfg = S.CONFIGS[args.design]
    ds = args.models[0].split("/", 1)[0]
    rows = cfg.stitch_train_rows
    for entry in cfg.stitch_train_rows_by_dataset:
        name, _, n = entry.partition("=")
        if name == ds:
            rows = int(n)
    d = {f: getattr(cfg, f) for f in SHARED_FIELDS}
    d.update(name=f"bench_{args.design}", zoo=str(zoo_dir), datasets=[ds],
             stitch_train_rows=args.stitch_train_rows or rows, stitch_steps=args.stitch_steps or cfg.stitch_steps)
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


# ----------------------------------------------------------------------------- one side (the child process)


def child(spec_path: str, result_path: str) -> None:
    spec = json.loads(pathlib.Path(spec_path).read_text())
    t_import = time.perf_counter()
    import jax

    import funsim
    from funsim import similarity
    from funsim.experiments import similarity_study as S

    where = {"funsim": funsim.__file__, "similarity": similarity.__file__, "study": S.__file__,
             "jax": jax.__version__, "compilation_cache": jax.config.jax_enable_compilation_cache}
    print(f"[{spec['side']}] funsim from {where['funsim']} (similarity {where['similarity']}), "
          f"jax {where['jax']}, compilation cache {where['compilation_cache']}", flush=True)
    fields = {f.name for f in dataclasses.fields(S.StudyConfig)}
    d = dict(spec["config"])
    if spec["side"] == "now":
        d.update({k: v for k, v in NEW_ONLY.items() if k in fields})
    d = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
    cfg = S.StudyConfig(**d)
    lines = []
    t0, c0 = time.perf_counter(), time.process_time()
    log = lambda msg: (lines.append((round(time.perf_counter() - t0, 1), msg)), print(f"  {msg}", flush=True))  # noqa: E731
    metrics = S.run(cfg, root=spec["root"], run_name=spec["side"], progress=False, log=log)
    result = {"side": spec["side"], "where": where, "run_wall": time.perf_counter() - t0,
              "run_cpu": time.process_time() - c0, "import_wall": t0 - t_import, "stages": metrics["stages"],
              "out": metrics["out"], "log": lines, "config": {k: getattr(cfg, k) for k in sorted(fields)
                                                              if k != "verdict_rules"}}
    pathlib.Path(result_path).write_text(json.dumps(result, indent=2, default=str))


# ----------------------------------------------------------------------------- the parent


def run_side(side: str, cfg: dict, work: pathlib.Path, pythonpath: pathlib.Path | None, tag: str) -> dict:
    root = work / f"results_{tag}"
    if root.exists():
        shutil.rmtree(root)
    spec = {"side": side, "config": cfg, "root": str(root)}
    spec_path, result_path = work / f"spec_{tag}.json", work / f"result_{tag}.json"
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ, FUNSIM_COMPILE_CACHE="off", JAX_ENABLE_COMPILATION_CACHE="false")
    env.pop("PYTHONPATH", None)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    # run the file, not the module: the child must not import this tree through the repository root
    subprocess.run([sys.executable, str(pathlib.Path(__file__).resolve()), "--child", str(spec_path), str(result_path)],
                   env=env, cwd=str(work), check=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = json.loads(result_path.read_text())
    out.update(wall=wall, cpu=(after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
    expect = "/pkg/funsim/" if side == "before" else str(REPO)
    if expect not in out["where"]["similarity"] and expect not in os.path.realpath(out["where"]["similarity"]):
        raise SystemExit(f"The {side} child imported funsim from {out['where']['similarity']}, not from {expect}.")
    return out


def _table(path: pathlib.Path) -> dict[tuple, float]:
    with open(path, newline="") as f:
        return {tuple(r[c] for c in ("dataset", "model_a", "layer_a", "model_b", "layer_b", "measure", "direction",
                                     "split", "task")): float(r["value"]) for r in csv.DictReader(f)}


def compare(before: dict, now: dict) -> list[dict]:
    """Per measure on the rows both tables share: count, max |difference| and mean |difference| (finite pairs)."""
    import math

    a, b = _table(pathlib.Path(before["out"]) / "comparisons.csv"), _table(pathlib.Path(now["out"]) / "comparisons.csv")
    by = {}
    for k in a.keys() & b.keys():
        by.setdefault(k[5], []).append((a[k], b[k]))
    rows = []
    for m in sorted(by):
        pairs = by[m]
        fin = [(x, y) for x, y in pairs if math.isfinite(x) and math.isfinite(y)]
        nan_mismatch = sum(math.isfinite(x) != math.isfinite(y) for x, y in pairs)
        d = [abs(x - y) for x, y in fin]
        rows.append({"measure": m, "shared": len(pairs), "finite": len(fin), "nan_mismatch": nan_mismatch,
                     "max_abs": max(d) if d else float("nan"), "mean_abs": sum(d) / len(d) if d else float("nan")})
    only = {"before_only": len(a.keys() - b.keys()), "now_only": len(b.keys() - a.keys())}
    rows.append({"measure": "(rows in one table only)", **only})
    return rows


def _stage(r: dict, name: str) -> float:
    return sum(float((s.get(name) or {}).get("seconds", 0.0)) for s in r["stages"].values())


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        child(*args.child)
        return 0
    if args.from_results:
        work = pathlib.Path(args.from_results)
        results = sorted((json.loads(f.read_text()) for f in work.glob("result_*.json")),
                         key=lambda r: (r.get("round", 0), r["side"] != order_first(args)))
        missing = [r["side"] for r in results if "wall" not in r]
        if missing:
            raise SystemExit(f"{work}: the results of {missing} lack the parent's wall and CPU times "
                             "(a run stopped mid-way, or one from before they were saved).")
        return report(args, results, None, None, None)
    work = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="bench_study_before_"))
    work.mkdir(parents=True, exist_ok=True)
    zoo_dir = subset_zoo(pathlib.Path(args.zoo), args.models, work / "zoo")
    pythonpath, commit = old_tree(args.before, work / "before")
    cfg = design(args, zoo_dir)
    now_commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
    print(f"work dir {work}\nbefore: {args.before} = {commit[:10]}; now: {REPO} at {now_commit} (+ working tree)")
    print(f"subset: {', '.join(args.models)}\ndesign: {json.dumps(cfg)}\nnow-only fields: {json.dumps(NEW_ONLY)}")
    print(f"load at start: {os.getloadavg()}", flush=True)
    order = (order_first(args), "now" if order_first(args) == "before" else "before")
    results = []
    for rnd in range(args.rounds):
        for side in order:
            load0 = os.getloadavg()
            r = run_side(side, cfg, work, pythonpath if side == "before" else None, f"{side}{rnd}")
            r.update(round=rnd, load_before=load0, load_after=os.getloadavg())
            (work / f"result_{side}{rnd}.json").write_text(json.dumps(r, indent=2, default=str))  # with the parent's times
            results.append(r)
            print(f"[{side} round {rnd}] wall {r['wall']:.1f} s, cpu {r['cpu']:.1f} s, grid {_stage(r, 'grid'):.1f} s, "
                  f"stitch {_stage(r, 'stitch'):.1f} s; load {load0[0]:.2f} -> {r['load_after'][0]:.2f}", flush=True)
    return report(args, results, commit, now_commit, cfg)


def order_first(args) -> str:
    return "before" if args.order == "before-first" else "now"


def report(args, results: list[dict], commit, now_commit, cfg) -> int:
    """The table, the ratios per round and the same-numbers check (round 0's tables)."""
    rounds = sorted({r["round"] for r in results})
    print("\n| round | side | wall s | CPU s | grid stage s | stitch stage s | load 1-min (start -> end) |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['round']} | {r['side']} | {r['wall']:.1f} | {r['cpu']:.1f} | {_stage(r, 'grid'):.1f} | "
              f"{_stage(r, 'stitch'):.1f} | {r['load_before'][0]:.2f} -> {r['load_after'][0]:.2f} |")
    ratios = []
    for rnd in rounds:
        sides = {r["side"]: r for r in results if r["round"] == rnd}
        if len(sides) < 2:
            continue
        b, n = sides["before"], sides["now"]
        ratio = {k: (b[k] / n[k] if n[k] else float("nan")) for k in ("wall", "cpu")}
        ratio.update({k: (_stage(b, k) / _stage(n, k) if _stage(n, k) else float("nan")) for k in ("grid", "stitch")})
        ratios.append(ratio)
        print(f"round {rnd}: before / now = wall {ratio['wall']:.2f}x, CPU {ratio['cpu']:.2f}x, "
              f"grid stage {ratio['grid']:.2f}x, stitch stage {ratio['stitch']:.2f}x")
    checks = compare(next(r for r in results if r["side"] == "before"), next(r for r in results if r["side"] == "now"))
    print("\nsame numbers? (round 0's tables, rows both share)")
    for c in checks:
        print("  " + ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in c.items()))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"args": vars(args), "commit_before": commit,
                                                       "commit_now": now_commit, "design": cfg,
                                                       "results": results, "ratios": ratios, "checks": checks},
                                                      indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
