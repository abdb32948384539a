"""``funsim ledger``: a long similarity study's finished units, kept in the repository across machines.

A study too long for one machine (the paper-scale runs; a study on a lent GPU, 10 minutes a command and
15 a session; a CPU run of several hours) is computed in pieces. Each machine starts fresh, so what it
finished must be kept somewhere that outlives it: a ledger, a folder committed with the project
(``experiments/ledger/<name>/``):

* ``ledger.json``: the run's name and config, the code version that computes it (every unit must
  record the same :func:`funsim.models.io.source_version`), the commit holding that code, the version of
  each data set's trained zoo (a hash of the weights; every unit records it), and one entry per piece:
  its file, SHA-256, the units it added, when, on which machine, and how long that machine ran;
* ``piece-NNN.tar.xz``: the unit files a piece added, never rewritten;
* optionally ``zoo.tar.xz``: the trained models the units were computed from, as
  :func:`funsim.models.zoo.carry_zoo` copies them (last checkpoints and packed data), so that a later
  machine need not retrain them to the same bits.

``funsim ledger record LEDGER --run RUN_DIR --device TEXT [--commit C]`` adds the run folder's units
that the ledger lacks as a new piece; units of another code version, zoo or config are refused.
``funsim ledger restore LEDGER --run RUN_DIR`` checks every piece's checksum and unpacks them into a run
folder; the study resumed there, with the ledger's commit and its zoo, computes only what is missing
(a resume refuses units of another code or zoo). docs/gpu.md has the whole loop.

No JAX: this module reads and writes files only.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import io
import json
import os
import pathlib
import sys
import tarfile
import tempfile

__all__ = ["LEDGER", "UNIT_GLOBS", "LedgerError", "record", "restore", "record_zoo", "restore_zoo", "status",
           "add_arguments", "main"]

LEDGER = "ledger.json"
UNIT_GLOBS = ("pairs/*/*.json", "stitch/**/*.json")  # a similarity study's units (similarity_study.UNIT_GLOBS)


class LedgerError(ValueError):
    """A ledger refused: units of another code version, zoo or config, or a damaged piece."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write_atomic(path: pathlib.Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _read_json(path: pathlib.Path, what: str):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise LedgerError(f"{what} {path} does not read back ({e}).") from None


def _units(run: pathlib.Path) -> dict[str, pathlib.Path]:
    return {f.relative_to(run).as_posix(): f for g in UNIT_GLOBS for f in sorted(run.glob(g)) if f.is_file()}


def _dataset(name: str) -> str:
    return name.split("/")[1]  # pairs/<data set>/... or stitch/<data set>/...


def _load(ledger: pathlib.Path) -> dict | None:
    return _read_json(ledger / LEDGER, "The ledger") if (ledger / LEDGER).is_file() else None


def _recorded(book: dict | None) -> set[str]:
    return {u for p in (book or {}).get("pieces", []) for u in p["units"]}


def _pack(root: pathlib.Path, names: list[str]) -> bytes:
    """``root``'s files ``names`` (relative paths) as a reproducible tar.xz (no times, owners or modes)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        for name in names:
            data = (root / name).read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def record_zoo(ledger: str | os.PathLike, zoo: str | os.PathLike) -> dict:
    """Keep the zoo the ledger's units were computed from: ``zoo``, a :func:`funsim.models.zoo.carry_zoo` copy
    whose folder name is the zoo's run name (the study's ``zoo``), packed as ``zoo.tar.xz`` (once; its SHA-256 in
    ``ledger.json``).

    The weights are not compared with the units' zoo version here (this module reads files only): a study
    resumed on the restored zoo does that, and refuses units of other weights.

    Raises:
      LedgerError: no ledger yet (record a piece first), a zoo kept there already, or ``zoo`` is not a carried zoo.
    """
    ledger, zoo = pathlib.Path(ledger), pathlib.Path(zoo)
    book = _load(ledger)
    if book is None:
        raise LedgerError(f"No ledger at {ledger / LEDGER}: record a piece first.")
    if "zoo_archive" in book:
        raise LedgerError(f"The ledger {ledger} keeps its zoo already ({book['zoo_archive']['file']}).")
    if not (zoo / "zoo.json").is_file() or not any(zoo.glob("data/*.npz")):
        raise LedgerError(f"{zoo} is not a carried zoo (zoo.json and data/*.npz): make one with "
                          "funsim.models.zoo.carry_zoo(TRAINED_ZOO, DIR, datasets=...).")
    if (want := book["config"].get("zoo")) and zoo.name != want:
        raise LedgerError(f"The carried zoo {zoo} is restored by its folder's name, {zoo.name!r}, but the run reads the "
                          f"zoo {want!r}: carry it into a folder named {want!r}.")
    names = sorted(f.relative_to(zoo).as_posix() for f in zoo.rglob("*") if f.is_file())
    data = _pack(zoo, names)
    entry = {"file": "zoo.tar.xz", "sha256": _sha256(data), "bytes": len(data), "name": zoo.name}
    _write_atomic(ledger / entry["file"], data)
    _write_atomic(ledger / LEDGER, (json.dumps({**book, "zoo_archive": entry}, indent=1) + "\n").encode())
    return entry


def restore_zoo(ledger: str | os.PathLike, dst: str | os.PathLike) -> pathlib.Path:
    """Unpack the ledger's ``zoo.tar.xz`` (checked against its SHA-256) into ``dst/<zoo name>``, which must not
    exist; returns that folder."""
    ledger, dst = pathlib.Path(ledger), pathlib.Path(dst)
    book = _load(ledger)
    entry = (book or {}).get("zoo_archive")
    if entry is None:
        raise LedgerError(f"The ledger {ledger} keeps no zoo: retrain the zoo by the command that trained it (the "
                          "resumed study checks its weights against the zoo version every unit records).")
    data = (ledger / entry["file"]).read_bytes() if (ledger / entry["file"]).is_file() else b""
    if _sha256(data) != entry["sha256"]:
        raise LedgerError(f"The ledger's zoo {ledger / entry['file']} is missing or damaged: its SHA-256 differs from "
                          f"the one recorded in {ledger / LEDGER}.")
    out = dst / entry["name"]
    if out.exists():
        raise LedgerError(f"{out} exists; restore the zoo into another folder.")
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:xz") as tar:
        tar.extractall(out, filter="data")
    return out


def record(ledger: str | os.PathLike, run: str | os.PathLike, *, device: str, commit: str | None = None,
           seconds: float | None = None, note: str = "") -> dict:
    """Add the finished units of the run folder ``run`` that ``ledger`` lacks, as a new piece.

    Args:
      ledger: the ledger's folder (created with the first piece).
      run: a similarity study's run folder (``results/similarity_study/<run>``).
      device: the machine that computed the new units, in words (e.g. "2-core CPU", "one NVIDIA H200").
      commit: the commit whose tree computed them (required for a new ledger; else checked if given).
      seconds: how long that machine ran for them (recorded).
      note: recorded beside the piece.

    Returns:
      the piece's entry (``{"file", "sha256", "units", ...}``), or ``{"units": []}`` when nothing is new.

    Raises:
      LedgerError: (a ``ValueError``) a unit of another code version or zoo than the ledger's (or than the
        run's other units), another config, a new ledger without ``commit``, or a damaged unit.
    """
    ledger, run = pathlib.Path(ledger), pathlib.Path(run)
    book = _load(ledger)
    config = _read_json(run / "config.json", "The run's config")
    units = _units(run)
    read = {name: _read_json(f, "The unit") for name, f in units.items()}
    code = {u.get("code") for u in read.values()} | ({book["code"]} if book else set())
    zoo: dict[str, set] = {}
    for name, u in read.items():
        zoo.setdefault(_dataset(name), set()).add(u.get("zoo"))
    for ds, v in (book or {}).get("zoo", {}).items():
        zoo.setdefault(ds, set()).add(v)
    problems = []
    if unversioned := sorted(n for n, u in read.items() if not (isinstance(u, dict) and u.get("code") and u.get("zoo"))):
        problems.append(f"{len(unversioned)} units record no code or zoo version (computed before units recorded "
                        f"both), e.g. {run / unversioned[0]}")
    if book and book["config"] != config:
        problems.append(f"the run's config differs from the ledger's ({run / 'config.json'} against {ledger / LEDGER})")
    if len(code) > 1:
        problems.append(f"units of {len(code)} code versions {sorted(map(str, code))} (one run, one code version)")
    problems += [f"{ds}: units of {len(v)} zoo versions {sorted(map(str, v))}" for ds, v in zoo.items() if len(v) > 1]
    if commit and book and book.get("commit") != commit:
        problems.append(f"commit {commit!r}, the ledger's is {book.get('commit')!r}")
    if not book and not commit:
        problems.append("a new ledger needs --commit: the commit whose tree computed the units")
    if problems:
        raise LedgerError(f"Refusing to record {run} in the ledger {ledger}:\n  " + "\n  ".join(problems)
                          + "\nRecord only units computed by the ledger's commit from its zoo (see `funsim ledger "
                            "restore`), or start another ledger.")
    new = sorted(set(units) - _recorded(book))
    if not new:
        return {"units": []}
    if book is None:
        book = {"experiment": "similarity_study", "run": run.name, "config": config, "code": code.pop(),
                "commit": commit, "zoo": {}, "pieces": []}
    book["zoo"] = {**book["zoo"], **{ds: v.pop() for ds, v in zoo.items()}}
    data = _pack(run, new)
    entry = {"file": f"piece-{len(book['pieces']) + 1:03d}.tar.xz", "sha256": _sha256(data), "bytes": len(data),
             "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
             "device": device, "seconds": seconds, "note": note, "units": new}
    if (ledger / entry["file"]).exists():
        raise LedgerError(f"{ledger / entry['file']} exists but {ledger / LEDGER} does not list it: a record was "
                          "interrupted between its two writes. Delete that file and record again.")
    _write_atomic(ledger / entry["file"], data)  # the piece first: the ledger never names a missing piece
    book["pieces"].append(entry)
    _write_atomic(ledger / LEDGER, (json.dumps(book, indent=1) + "\n").encode())
    return entry


def restore(ledger: str | os.PathLike, run: str | os.PathLike) -> dict[str, int]:
    """Unpack every piece of ``ledger`` into the run folder ``run`` (created with the ledger's config if absent).

    Every piece is checked against its SHA-256 before anything is written. Units the run already has are
    kept when they are byte for byte the ledger's; a differing one is refused (named).

    Returns:
      ``{"restored": units written, "kept": units already there}``.

    Raises:
      LedgerError: a damaged or missing piece, a run folder of another config, or a differing unit.
    """
    ledger, run = pathlib.Path(ledger), pathlib.Path(run)
    book = _load(ledger)
    if book is None:
        raise LedgerError(f"No ledger at {ledger / LEDGER}.")
    if (run / "config.json").is_file() and _read_json(run / "config.json", "The run's config") != book["config"]:
        raise LedgerError(f"Refusing to restore {ledger} into {run}: the run folder holds another config. Restore "
                          "into a new run folder.")
    files = {}
    for p in book["pieces"]:
        path = ledger / p["file"]
        if not path.is_file():
            raise LedgerError(f"The ledger's piece {path} is missing (listed in {ledger / LEDGER}).")
        data = path.read_bytes()
        if _sha256(data) != p["sha256"]:
            raise LedgerError(f"The ledger's piece {path} is damaged: its SHA-256 differs from the one recorded in "
                              f"{ledger / LEDGER}. Restore it from version control (git checkout -- {path}).")
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:xz") as tar:
            for m in tar.getmembers():
                parts = pathlib.PurePosixPath(m.name).parts
                if m.name not in p["units"] or not m.isfile() or parts[0] not in ("pairs", "stitch") or ".." in parts:
                    raise LedgerError(f"The ledger's piece {path} holds {m.name!r}, which its entry does not list.")
                files[m.name] = tar.extractfile(m).read()
    clash = [n for n, d in files.items() if (run / n).is_file() and (run / n).read_bytes() != d]
    if clash:
        raise LedgerError(f"Refusing to restore {ledger} into {run}: {len(clash)} units there differ from the "
                          "ledger's:\n  " + "\n  ".join(str(run / n) for n in clash[:10])
                          + "\nRestore into a new run folder.")
    if not (run / "config.json").is_file():
        _write_atomic(run / "config.json", (json.dumps(book["config"], indent=2) + "\n").encode())
    written = 0
    for name, data in files.items():
        if not (run / name).is_file():
            _write_atomic(run / name, data)
            written += 1
    return {"restored": written, "kept": len(files) - written}


def status(ledger: str | os.PathLike) -> str:
    """A few lines: the run, its commit, the pieces (units, machine, seconds) and the next command.

    Raises:
      LedgerError: no ledger at ``ledger``.
    """
    ledger = pathlib.Path(ledger)
    book = _load(ledger)
    if book is None:
        raise LedgerError(f"No ledger at {ledger / LEDGER}.")
    lines = [f"{ledger}: run {book['run']!r} ({book['experiment']}), code {book['code']} of commit {book['commit']}, "
             f"zoo {book['zoo']}, {len(_recorded(book))} units in {len(book['pieces'])} pieces:"]
    for p in book["pieces"]:
        secs = "" if p["seconds"] is None else f", {p['seconds']:.0f} s"
        lines.append(f"  {p['file']}: {len(p['units'])} units, {p['date']}, {p['device']}{secs}"
                     + (f"; {p['note']}" if p["note"] else ""))
    if "zoo_archive" in book:
        lines.append(f"  zoo: {book['zoo_archive']['file']} ({book['zoo_archive']['bytes']} bytes, zoo "
                     f"{book['zoo_archive']['name']!r})")
    zoo = " --zoo-into RESULTS/zoo" if "zoo_archive" in book else ""
    lines.append(f"Continue: `git worktree add /tmp/pin {book['commit']}`, `funsim ledger restore {ledger} --run "
                 f"RESULTS/similarity_study/{book['run']}{zoo}`" + ("" if zoo else " and retrain the same zoo")
                 + ", then run the study with that tree (docs/gpu.md, \"A ledger\").")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = sub.add_parser("record", help="add a run folder's new units to the ledger as a piece")
    p.add_argument("ledger", help="the ledger's folder, e.g. experiments/ledger/NAME")
    p.add_argument("--run", required=True, help="the study's run folder, e.g. results/similarity_study/RUN")
    p.add_argument("--device", required=True, help="the machine that computed the new units, in words")
    p.add_argument("--commit", help="the commit whose tree computed them (required for a new ledger)")
    p.add_argument("--seconds", type=float, help="how long the machine ran for them")
    p.add_argument("--note", default="", help="recorded beside the piece")
    p.add_argument("--zoo", help="also keep this carried zoo (models.zoo.carry_zoo) as zoo.tar.xz, once")
    p = sub.add_parser("restore", help="unpack the ledger's units into a run folder")
    p.add_argument("ledger")
    p.add_argument("--run", required=True, help="the run folder to restore into")
    p.add_argument("--zoo-into", help="also unpack the ledger's zoo into this folder (e.g. results/zoo)")
    p = sub.add_parser("status", help="the ledger's pieces and how to continue")
    p.add_argument("ledger")


def main(args: argparse.Namespace) -> int:
    try:
        if args.action == "record":
            entry = record(args.ledger, args.run, device=args.device, commit=args.commit, seconds=args.seconds,
                           note=args.note)
            print(f"recorded {len(entry['units'])} new units" + (f" as {entry['file']}" if entry["units"] else ""))
            if args.zoo:
                print(f"kept the zoo {args.zoo}: {record_zoo(args.ledger, args.zoo)['file']}")
        elif args.action == "restore":
            print(f"restored into {args.run}: {restore(args.ledger, args.run)}")
            if args.zoo_into:
                print(f"restored the zoo into {restore_zoo(args.ledger, args.zoo_into)}")
        print(status(args.ledger))
    except LedgerError as e:
        print(f"funsim ledger: error: {e}", file=sys.stderr)
        return 1
    return 0
