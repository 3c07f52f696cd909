"""Mutation testing of the crash-safety core with cosmic-ray (`make mutate`; not part of CI).

Mutated: bench/storage/manifest.py, generations.py, tree.py, layout.py, checksums.py, verify.py, and
the commit and delete paths of the striped engines' writer, bench/engines/stripes.py (`commit`,
`abort`, `prepare`, `delete`). Each module is its own cosmic-ray session, whose test command runs the fast tests of
that module (TESTS below) with `-x`: a mutant is killed when one of them fails.

Two things keep a run within minutes on 2 cores:
- The operator set is cosmic-ray's core set, less the binary-operator replacements into
  Div, FloorDiv, Mod, Pow, shifts and bitwise operators: each arithmetic site is still mutated
  (into +, -, *), without ten near-identical mutants per `+`.
- The tests run in a fork of a server process that has imported torch, numpy, pytest and
  hypothesis once (`serve`); cosmic-ray's test command is a small client (`pytest`) that asks
  it for a run. bench itself is never imported by the server, so every fork imports the
  mutated file from disk (bytecode caching off).
The sessions run in WORKERS copies of the repository under .mutate/ (cosmic-ray writes each
mutant into the file itself), each with its own server.

Beside the mutants, every full run plants the defects of PLANTS one at a time (removals of an
fsync, which no operator makes) and runs the tests that must catch each: the power-cut tests
(tests/test_powercut.py). `--only plants` runs those alone.

The score is killed / mutants run, and killed / (mutants run - equivalent ones). Survivors
listed in scripts/mutate_equivalent.txt (module, line, operator, and why the mutant cannot
change behaviour) are reported as equivalent; any other survivor makes the run exit 1.

    python scripts/mutate.py               # everything (make mutate)
    python scripts/mutate.py --only tree   # one module
    python scripts/mutate.py --only plants # the planted defects only
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import shlex
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORK = REPO / ".mutate"
WORKERS = 2
TIMEOUT_S = 45.0  # one mutant's test run (the slowest module's tests take ~15 s); a mutant
# that loops for ever is ended by it and counts as killed

_PYTEST = "-x -q -p no:cacheprovider -p no:benchmark"
# module -> (file, tests): the fast tests that say whether the module still does its job.
TESTS: dict[str, tuple[str, str]] = {
    "tree": (
        "bench/storage/tree.py",
        "tests/test_properties.py -k tree; tests/test_engines.py -k 'training_state'",
    ),
    "checksums": (
        "bench/storage/checksums.py",
        "tests/test_properties.py -k 'wsum64 or entry_matches or pieces_written';"
        " tests/test_manifest_errors.py -k 'flipped'",
    ),
    "layout": (
        "bench/storage/layout.py",
        "tests/test_properties.py -k 'layout or pieces_written or bounce or longer or one_byte';"
        " tests/test_manifest_errors.py -k 'flipped or truncated or missing_data'",
    ),
    "manifest": (
        "bench/storage/manifest.py",
        "tests/test_properties.py -k 'manifest or commit or save_ids or fsync_dir';"
        " tests/test_generations.py;"
        " tests/test_manifest_errors.py -k 'manifest or refused or first_target'",
    ),
    "generations": (
        "bench/storage/generations.py",
        "tests/test_generations.py; tests/test_manifest_errors.py -k 'interrupted or marker or"
        " leftover or overlapping or garbled or replaces or refused or first_target'",
    ),
    "verify": ("bench/storage/verify.py", "tests/test_verify.py"),
    "stripes": (
        "bench/engines/stripes.py",
        "tests/test_generations.py; tests/test_manifest_errors.py -k 'replaces or interrupted"
        " or marker or overlapping or garbled or enospc'; tests/test_registry.py -k contract",
    ),
}
STRIPED_FUNCTIONS = {"commit", "abort", "prepare", "delete"}
# Defects no operator makes (cosmic-ray never removes a call), planted one at a time into a copy
# of the code by every full run (and by `--only plants`): name -> (file, the text removed or
# changed, what replaces it, the tests that must fail). A plant whose tests pass is reported
# like a survivor; a plant whose text is no longer in the file stops the run (update it).
PLANTS: dict[str, tuple[str, str, str, str]] = {
    "the manifest's temp file not fsync'd before its rename": (
        "bench/storage/manifest.py",
        "        os.fsync(f.fileno())\n    os.replace(tmp, final)\n",
        "    os.replace(tmp, final)\n",
        "tests/test_powercut.py -k 'committed_manifest or (at_any_step and cpu-single)'",
    ),
    "no fsync of the directory after the manifest's rename": (
        "bench/storage/manifest.py",
        "    os.replace(tmp, final)\n    fsync_dir(os.path.dirname(final))\n",
        "    os.replace(tmp, final)\n",
        "tests/test_powercut.py -k committed_manifest",
    ),
    "the data files not fsync'd before the commit (drain)": (
        "bench/engines/stripes.py",
        "            list(self.pool.map(os.fsync, fds.values()))\n",
        "",
        "tests/test_powercut.py -k 'at_any_step and cpu-single'",
    ),
    "the files kvikio wrote not fsync'd before the commit (finish)": (
        "bench/engines/stripes.py",
        "                os.fsync(fd)\n            finally:\n                os.close(fd)\n",
        "                pass\n            finally:\n                os.close(fd)\n",
        "tests/test_powercut.py -k kvikio",
    ),
}
# Binary operators are mutated into +, - and * only (see the module docstring).
DROPPED_OPERATORS = re.compile(
    r"core/ReplaceBinaryOperator_\w+_(Div|FloorDiv|Mod|Pow|RShift|LShift|BitOr|BitAnd|BitXor)$"
)
PRELOAD = ["torch", "numpy", "pandas", "xxhash", "pytest", "hypothesis", "yaml", "psutil"]


# -- the test server and its client -------------------------------------------------------------


def serve(sock_path: str, root: str) -> None:
    """Import the heavy libraries once, then run each request's pytest in a fork of this
    process, in `root` (a copy of the repository). bench is never imported here."""
    import importlib

    sys.dont_write_bytecode = True
    for m in PRELOAD:
        importlib.import_module(m)
    os.chdir(root)
    sys.path.insert(0, root)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(sock_path)
    srv.listen(4)
    took: dict[str, float] = {}  # seconds of each test run on the unmutated code
    while True:
        conn, _ = srv.accept()
        args = conn.recv(65536).decode().split("\0")
        if args == ["quit"]:
            srv.close()
            conn.close()
            return
        pid = os.fork()
        if pid == 0:  # the child: a fresh import of bench, from the (mutated) files
            srv.close()
            os.setpgid(0, 0)  # its own group: a timeout ends its helpers too
            import pytest

            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            code = 1
            try:
                code = int(pytest.main(args))
            finally:
                os._exit(code)
        # A mutant that loops for ever is killed here, before cosmic-ray's own timeout (which
        # can only end the client), so that the server is free for the next one: after 3x
        # (+5 s) what the same tests took on the code unmutated (cosmic-ray's baseline run
        # comes first), at most TIMEOUT_S.
        key = "\0".join(args)
        t_start = time.monotonic()
        limit = min(TIMEOUT_S * 0.8, 3 * took[key] + 5) if key in took else TIMEOUT_S * 0.8
        deadline = t_start + limit
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                code = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() > deadline:
                try:
                    os.killpg(pid, 9)
                except ProcessLookupError:
                    pass
                os.waitpid(pid, 0)
                code = 124
                break
            time.sleep(0.02)
        if key not in took and code == 0:
            took[key] = time.monotonic() - t_start
        conn.sendall(str(code).encode())
        conn.close()


def client(sock_path: str, args: list[str]) -> int:
    """cosmic-ray's test command: run each pytest argument list of `args` (separated by
    `;;`) through the server, in order; the first failure's exit code, else 0."""
    runs: list[list[str]] = [[]]
    for x in args:
        if x == ";;":
            runs.append([])
        else:
            runs[-1].append(x)
    for run in runs:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(sock_path)
            s.sendall("\0".join(run).encode())
            code = int(s.recv(64) or b"1")
        if code:
            return code
    return 0


# -- sessions -----------------------------------------------------------------------------------


def _copy(dest: Path, tests_at: str | None) -> None:
    """The repository's code and tests, without bytecode (a copy per worker); the tests as
    they were at git revision `tests_at` if given (to score an older suite on today's code)."""
    if dest.exists():
        shutil.rmtree(dest)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "scratch", "results", ".*")
    for part in ("bench", "analysis", "tests", "configs"):
        shutil.copytree(REPO / part, dest / part, ignore=ignore)
    shutil.copy(REPO / "pyproject.toml", dest / "pyproject.toml")
    if tests_at:
        shutil.rmtree(dest / "tests")
        tar = subprocess.run(
            ["git", "-C", str(REPO), "archive", tests_at, "tests"], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=tar, check=True)


def _config(name: str, module: str, sock: str, path: Path) -> None:
    client_cmd = f"{sys.executable} {REPO / 'scripts' / 'mutate.py'} pytest --socket {sock} --"
    # A test file the copy does not have (an older suite) is left out.
    runs = " ;; ".join(
        f"{_PYTEST} {t.strip()}"
        for t in TESTS[name][1].split(";")
        if (path.parent / t.split()[0]).exists()
    )
    path.write_text(
        "[cosmic-ray]\n"
        f'module-path = "{module}"\n'
        f"timeout = {TIMEOUT_S}\n"
        "excluded-modules = []\n"
        # the fastest test file first; each must pass for the mutant to survive
        f'test-command = "{client_cmd} {runs}"\n'
        "\n[cosmic-ray.distributor]\nname = 'local'\n"
    )


def _skip(db: Path, module: str, root: Path) -> None:
    """Mark as skipped the mutants outside the set: dropped operators everywhere, mutants
    inside annotations, and in stripes.py anything outside its commit and delete paths."""
    tree_ = ast.parse((root / module).read_text())
    keep: list[tuple[int, int]] | None = None
    if module.endswith("stripes.py"):
        keep = [
            (n.lineno, n.end_lineno or n.lineno)
            for n in ast.walk(tree_)
            if isinstance(n, ast.FunctionDef) and n.name in STRIPED_FUNCTIONS
        ]
    # Annotations are never evaluated (every module has `from __future__ import annotations`):
    # a mutant inside one cannot change behaviour.
    notes = [n for x in ast.walk(tree_) for n in _annotations(x)]

    def in_annotation(row: int, col: int) -> bool:
        return any(
            (n.lineno, n.col_offset) <= (row, col) < (n.end_lineno or 0, n.end_col_offset or 0)
            for n in notes
        )

    con = sqlite3.connect(db)
    specs = con.execute(
        "select job_id, operator_name, start_pos_row, start_pos_col from mutation_specs"
    ).fetchall()
    skipped = [
        (job,)
        for job, op, row, col in specs
        if DROPPED_OPERATORS.match(op)
        or (keep is not None and not any(a <= row <= b for a, b in keep))
        or in_annotation(row, col)
    ]
    con.executemany(
        "insert or replace into work_results (job_id, worker_outcome, output, test_outcome, diff)"
        " values (?, 'SKIPPED', 'outside the mutated set', NULL, NULL)",
        skipped,
    )
    con.commit()
    con.close()


def _annotations(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return [node.returns] if node.returns else []
    if isinstance(node, ast.arg | ast.AnnAssign):
        return [node.annotation] if node.annotation else []
    return []


def _run_session(name: str, slot: Path, sock: str) -> Path:
    module = TESTS[name][0]
    cfg, db = slot / f"{name}.toml", slot / f"{name}.sqlite"
    _config(name, module, sock, cfg)
    if db.exists():
        db.unlink()
    cr = str(Path(sys.executable).parent / "cosmic-ray")
    subprocess.run([cr, "init", cfg.name, db.name], cwd=slot, check=True, capture_output=True)
    _skip(db, module, slot)
    # the tests must pass on the code as it is, else every mutant would look killed
    base = subprocess.run([cr, "baseline", cfg.name], cwd=slot, capture_output=True, text=True)
    if base.returncode:
        raise SystemExit(
            f"mutate: the tests of {name} fail without a mutant:\n{base.stdout[-2000:]}"
        )
    subprocess.run([cr, "exec", cfg.name, db.name], cwd=slot, check=True, capture_output=True)
    return db


def _run_plants(slot: Path, sock: str) -> list[tuple[str, int]]:
    """Plant each of PLANTS alone into the copy at `slot` and run its tests through the
    server: (name, exit code) each, 0 where the tests did not catch it."""
    out = []
    for name, (module, old, new, tests) in PLANTS.items():
        args = _PYTEST.split() + shlex.split(tests)
        # the tests must pass without the plant, else the plant would look caught
        if client(sock, args):
            raise SystemExit(f"mutate: the tests of plant {name!r} fail without it: {tests}")
        path = slot / module
        text = path.read_text()
        if text.count(old) != 1:
            raise SystemExit(f"mutate: plant {name!r}: its text is not in {module} once; update it")
        path.write_text(text.replace(old, new))
        try:
            code = client(sock, args)
        finally:
            path.write_text(text)
        out.append((name, code))
    return out


def _results(db: Path) -> list[tuple[str, str, int, str, str]]:
    """(outcome, module, line, operator, diff) of every mutant that ran."""
    con = sqlite3.connect(db)
    rows = con.execute(
        "select r.test_outcome, s.module_path, s.start_pos_row, s.operator_name, r.diff"
        " from work_results r join mutation_specs s on r.job_id = s.job_id"
        " where r.worker_outcome = 'NORMAL'"
    ).fetchall()
    con.close()
    return rows


def _equivalent() -> dict[tuple[str, int, str], str]:
    """The survivors judged equivalent: `module:line operator  # why` per line."""
    out = {}
    path = REPO / "scripts" / "mutate_equivalent.txt"
    for line in path.read_text().splitlines() if path.exists() else []:
        if not line.strip() or line.startswith("#"):
            continue
        where, _, why = line.partition("#")
        loc, op = where.split()
        mod, ln = loc.rsplit(":", 1)
        out[(mod, int(ln), op)] = why.strip()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd")
    s = sub.add_parser("serve")
    s.add_argument("--socket", required=True)
    s.add_argument("--root", required=True)
    c = sub.add_parser("pytest")
    c.add_argument("--socket", required=True)
    c.add_argument("args", nargs=argparse.REMAINDER)
    p.add_argument(
        "--only",
        action="append",
        choices=[*sorted(TESTS), "plants"],
        help="these modules only (plants: the planted defects only)",
    )
    p.add_argument("--workers", type=int, default=WORKERS)
    p.add_argument("--report", action="store_true", help="report the sessions under .mutate/")
    p.add_argument("--tests-at", help="score the tests of this git revision (today's code)")
    a = p.parse_args(argv)
    if a.cmd == "serve":
        serve(a.socket, a.root)
        return 0
    if a.cmd == "pytest":
        return client(a.socket, [x for x in a.args if x != "--"])

    names = [n for n in a.only or list(TESTS) if n != "plants"]
    plants = not a.only or "plants" in a.only
    if a.report:
        return report(sorted(WORK.glob("w*/*.sqlite")), 0.0)
    WORK.mkdir(exist_ok=True)
    t0 = time.monotonic()
    slots, servers = [], []
    for i in range(max(1, min(a.workers, len(names)))):
        slot = WORK / f"w{i}"
        _copy(slot, a.tests_at)
        sock = str(WORK / f"w{i}.sock")
        if os.path.exists(sock):
            os.unlink(sock)
        env = {
            **os.environ,
            "PYTHONDONTWRITEBYTECODE": "1",
            "CKPTBENCH_SCRATCH": str(slot / "scratch"),
            "CKPTBENCH_HYPOTHESIS": "mutate",
        }
        servers.append(
            subprocess.Popen(
                [sys.executable, __file__, "serve", "--socket", sock, "--root", str(slot)], env=env
            )
        )
        slots.append((slot, sock))
    for _, sock in slots:
        while not os.path.exists(sock):
            time.sleep(0.1)
    try:
        queue = list(names)
        dbs: list[Path] = []

        def worker(slot: Path, sock: str) -> None:
            while queue:
                name = queue.pop(0)
                print(f"mutate: {name} ...", flush=True)
                dbs.append(_run_session(name, slot, sock))

        with ThreadPoolExecutor(len(slots)) as pool:
            for f in [pool.submit(worker, *s) for s in slots]:
                f.result()
        planted = _run_plants(*slots[0]) if plants else []
    finally:
        for _, sock in slots:
            try:
                client(sock, ["quit"])
            except OSError:
                pass
        for srv in servers:
            srv.wait(30)
    return report(dbs, t0, planted)


def report(dbs: list[Path], t0: float, planted: list[tuple[str, int]] | None = None) -> int:
    """The score, per module and in all, and every survivor: equivalent (with why) or not.
    The score counts a survivor judged equivalent as a survivor; the second score leaves
    them out (an equivalent mutant is the same program)."""
    rows = [r for db in dbs for r in _results(db)]
    known = _equivalent()
    # A survivor is equivalent when the file explains its module, line and operator (a mutant
    # of the same key that changes behaviour would have been killed, not survived).
    rows = [
        ("EQUIVALENT", *r[1:]) if r[0] == "SURVIVED" and (r[1], r[2], r[3]) in known else r
        for r in rows
    ]
    killed = sum(r[0] == "KILLED" for r in rows)
    equivalent = sum(r[0] == "EQUIVALENT" for r in rows)
    survived = [r for r in rows if r[0] == "SURVIVED"]
    print(
        f"\nmutate: {len(rows)} mutants, {killed} killed, {equivalent} survivors judged "
        f"equivalent, {len(survived)} other survivors"
    )
    by_module: dict[str, list[int]] = {}
    for r in rows:
        k = by_module.setdefault(r[1], [0, 0, 0])
        k[0] += r[0] == "KILLED"
        k[1] += r[0] == "EQUIVALENT"
        k[2] += 1
    for mod, (k, e, n) in sorted(by_module.items()):
        print(f"  {mod}: {k}/{n} killed, {e} equivalent")
    for _, mod, line, op, diff in sorted(survived, key=lambda r: (r[1], r[2], r[3])):
        print(f"  survived {mod}:{line} {op}: NOT EXPLAINED")
        print("    " + "\n    ".join((diff or "").splitlines()[2:]))
    n = len(rows)
    score = killed / n if n else 0.0
    real = killed / (n - equivalent) if n - equivalent else 0.0
    took = f" in {time.monotonic() - t0:.0f} s" if t0 else ""
    print(
        f"mutate: score {score:.1%} ({killed}/{n}), {real:.1%} of the mutants that are not "
        f"equivalent ({killed}/{n - equivalent}){took}"
    )
    missed = [name for name, code in planted or [] if code == 0]
    for name, code in planted or []:
        print(f"  plant: {name}: {'NOT CAUGHT' if code == 0 else 'caught'}")
    if planted:
        print(f"mutate: {len(planted) - len(missed)} of {len(planted)} planted defects caught")
    return 1 if survived or missed else 0


if __name__ == "__main__":
    sys.exit(main())
