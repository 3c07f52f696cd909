"""The GPU check's Python environment: what the machine's python3 lacks or holds too old, and
whether the result holds together. Used by scripts/gpu_wheels.sh, scripts/gpu_check.sh and its
rehearsal.

    python scripts/gpu_env.py needs                  # requirements the base does not hold
    python scripts/gpu_env.py beyond WHEEL...        # their requirements the base lacks
    python scripts/gpu_env.py have                   # the base's versions here
    python scripts/gpu_env.py plan WHEELS_DIR        # the wheels `install` takes, and why
    python scripts/gpu_env.py install WHEELS_DIR SITE [--notes FILE]
    python scripts/gpu_env.py verify --site SITE [--notes FILE]
    python scripts/gpu_env.py modules                # the modules `verify` imports
    python scripts/gpu_env.py base VENV              # the rehearsal's base (see `make_base`)

The base is the image's documented packages (scripts/gpu-base.txt). The check installs wheels
with `pip install --target` into SITE, which comes first on PYTHONPATH, not into a venv: the
machine's python3 is itself a venv (/opt/torch/.venv), and a venv made from it with
--system-site-packages would see the interpreter's own site-packages, not that venv's torch.
It installs a wheel whose distribution the base lacks, and one whose distribution the base holds
in a version too old for a requirement of what the run loads (pydantic needs
typing-extensions>=4.16.0 whatever the image holds).

`verify` exits 0 when the run can go on, 3 when only kvikio's side failed (the check goes on
without gds, and SITE's notes say why), 2 when the run cannot go on. It runs `pip check` over
the environment as the run sees it (the base and SITE), checks the project's requirements, and
imports every module the run imports: each module of bench and analysis, and every module their
code (and the check's scripts) imports by name, as found in their source; kvikio's side also
imports the top-level modules of kvikio's installed dependencies (cupy where installed). A
`pip check` line is fatal when it concerns what the run loads, kvikio's when it concerns kvikio's
side alone, and only noted when it concerns the machine's own torch and CUDA packages (the check
cannot replace them; the imports decide) or packages the run does not load.
"""

from __future__ import annotations

import argparse
import ast
import importlib.metadata as md
import re
import subprocess
import sys
import sysconfig
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import tomllib
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BASE_FILE = HERE / "gpu-base.txt"
# kvikio's distributions: what a failure of the kvikio step is confined to, with what only they
# require (found through their metadata).
KVIKIO = ("kvikio-cu13", "libkvikio-cu13")
# The project's packages, and the check's own scripts that run in the checked environment: the
# modules `verify` imports are found in their source.
PACKAGES = ("bench", "analysis")
SCRIPTS = ("gpu_table.py", "gpu_sizing.py")
# `verify`'s exit codes besides 0.
FATAL = 2
KVIKIO_ONLY = 3


def base_names(gpu: bool = True) -> list[str]:
    """The distributions of scripts/gpu-base.txt (without the gpu-only ones when `gpu` is
    false)."""
    out = []
    for line in BASE_FILE.read_text().splitlines():
        words = line.split("#", 1)[0].split()
        if words and (gpu or "gpu-only" not in words[1:]):
            out.append(canonicalize_name(words[0]))
    return out


def machine_own() -> set[str]:
    """The machine's own torch and CUDA packages: the check never installs or replaces them."""
    return {"torch"} | (set(base_names()) - set(base_names(gpu=False)))


def project_requirements() -> list[Requirement]:
    with open(REPO / "pyproject.toml", "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    return [Requirement(d) for d in deps]


def _applies(req: Requirement) -> bool:
    env = {**default_environment(), "extra": ""}
    return req.marker is None or req.marker.evaluate(env)


def _meets(req: Requirement, version: str | Version) -> bool:
    return not req.specifier or req.specifier.contains(Version(str(version)), prereleases=True)


def installed(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def needs() -> list[str]:
    """The project's requirements whose distributions the base does not list (torch is the
    machine's own)."""
    base = set(base_names())
    return [str(r) for r in project_requirements() if canonicalize_name(r.name) not in base]


def beyond_base(wheels: list[Path]) -> list[str]:
    """The runtime requirements of these wheels (their own METADATA's pins) that neither the
    base nor the wheels themselves meet."""
    have = set(base_names()) | {_wheel_name(w) for w in wheels}
    out = []
    for w in wheels:
        for line in wheel_requires(w):
            r = Requirement(line)
            if _applies(r) and canonicalize_name(r.name) not in have and str(r) not in out:
                out.append(str(r))
    return out


def have() -> list[str]:
    """Each base distribution with the version this python has, or `absent`."""
    gpu_only = set(base_names()) - set(base_names(gpu=False))
    return [
        f"  {n:20} {installed(n) or 'absent'}{'  (gpu-only)' if n in gpu_only else ''}"
        for n in base_names()
    ]


def _wheel_name(path: Path) -> str:
    return canonicalize_name(path.name.split("-")[0])


def _requires(dist: str) -> list[Requirement]:
    """The requirements of an installed distribution that apply here (no extras)."""
    return [r for r in map(Requirement, md.distribution(dist).requires or []) if _applies(r)]


def wheel_requires(wheel: Path) -> list[str]:
    """The Requires-Dist lines of a wheel's own metadata."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    return [ln.split(": ", 1)[1] for ln in text.splitlines() if ln.startswith("Requires-Dist: ")]


@dataclass(frozen=True)
class Wheel:
    """A wheel of the check's folder: its distribution, version and requirements that apply
    here."""

    path: Path
    name: str
    version: Version
    requires: tuple[Requirement, ...]


def wheels_in(folder: Path) -> dict[str, Wheel]:
    """The wheels of `folder` by distribution name."""
    out = {}
    for p in sorted(folder.glob("*.whl")):
        name, version, _, _ = parse_wheel_filename(p.name)
        reqs = tuple(r for r in map(Requirement, wheel_requires(p)) if _applies(r))
        out[canonicalize_name(name)] = Wheel(p, canonicalize_name(name), version, reqs)
    return out


def _closure(roots: list[str], wheels: dict[str, Wheel], chosen: dict[str, str]) -> set[str]:
    """The distributions `roots` load, through their requirements: a chosen wheel's own, else
    the installed version's. The machine's own torch and CUDA packages are not followed."""
    own = machine_own()
    seen: set[str] = set()
    todo = [canonicalize_name(n) for n in roots]
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if n in own:
            continue
        todo += [canonicalize_name(r.name) for r in _dist_requires(n, wheels, chosen)]
    return seen


def _dist_requires(
    name: str, wheels: dict[str, Wheel], chosen: dict[str, str]
) -> list[Requirement]:
    """A distribution's requirements as the run will see it: the chosen wheel's, else the
    installed version's (none when absent)."""
    if name in chosen:
        return list(wheels[name].requires)
    return _requires(name) if installed(name) is not None else []


def _project_names() -> list[str]:
    return [canonicalize_name(r.name) for r in project_requirements()]


@dataclass
class Plan:
    """What `install` takes from the wheels: `core` (what the CPU paths need too) and `kvikio`
    (what only kvikio needs), `why` a wheel over a distribution the base holds, and `unmet`:
    requirements that neither the base nor a wheel meets (verify then fails on them)."""

    core: list[Wheel] = field(default_factory=list)
    kvikio: list[Wheel] = field(default_factory=list)
    why: dict[str, str] = field(default_factory=dict)
    unmet: list[str] = field(default_factory=list)


def plan(folder: Path) -> Plan:
    """The wheels to install: each whose distribution this python lacks, and each whose
    distribution it holds in a version that does not meet a requirement of what the run or
    kvikio loads, where the wheel's version does (until nothing changes: a wheel taken brings
    its own requirements)."""
    wheels = wheels_in(folder)
    chosen = {n: "" for n in wheels if installed(n) is None}
    own = machine_own()
    unmet: dict[str, str] = {}
    changed = True
    while changed:
        changed = False
        for n in sorted(_closure(_project_names() + list(KVIKIO), wheels, chosen) - own):
            for r in _dist_requires(n, wheels, chosen):
                d = canonicalize_name(r.name)
                have = installed(d)
                if d in chosen or have is None or _meets(r, have):
                    continue
                if d in wheels and _meets(r, wheels[d].version):
                    chosen[d] = f"the base's {d} {have} does not meet {r} ({n}'s)"
                    unmet.pop(d, None)
                    changed = True
                else:
                    unmet[d] = (
                        f"the base's {d} {have} does not meet {r} ({n}'s), and no wheel in "
                        f"{folder} does"
                    )
    core = _closure(_project_names(), wheels, chosen)
    return Plan(
        core=[wheels[n] for n in sorted(chosen) if n in core],
        kvikio=[wheels[n] for n in sorted(chosen) if n not in core],
        why={n: why for n, why in chosen.items() if why},
        unmet=list(unmet.values()),
    )


def _note(notes: Path | None, line: str) -> None:
    """One line for the table (scripts/gpu_table.py --notes)."""
    if notes is not None:
        with open(notes, "a") as f:
            f.write(line + "\n")


def _pip_install(wheels: list[Wheel], site: Path) -> str | None:
    """Install `wheels` into `site` offline; None, or why not in one line."""
    cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--quiet"]
    cmd += ["--no-index", "--no-deps", "--no-compile", "--upgrade", "--target", str(site)]
    p = subprocess.run(cmd + [str(w.path) for w in wheels], capture_output=True, text=True)
    if p.returncode == 0:
        return None
    last = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
    return f"pip install failed: {last}"


def install(folder: Path, site: Path, notes: Path | None = None) -> int:
    """Install the plan into `site`: the wheels the CPU paths need first (a failure ends the
    check: exit 2), then kvikio's (a failure is noted, and verify then confines it to gds)."""
    p = plan(folder)
    names = " ".join(w.path.name for w in p.core + p.kvikio)
    print(f"== install (offline) into {site}: {names}", flush=True)
    for name, why in p.why.items():
        print(f"gpu_env: {name} from the wheels too, first on PYTHONPATH: {why}")
    for why in p.unmet:
        print(f"gpu_env: {why}", file=sys.stderr)
    site.mkdir(parents=True, exist_ok=True)
    for part, wheels in (("core", p.core), ("kvikio", p.kvikio)):
        why = _pip_install(wheels, site) if wheels else None
        if why and part == "core":
            print(f"gpu_env: {why}", file=sys.stderr)
            return FATAL
        if why:
            print(f"gpu_env: kvikio's wheels: {why}", file=sys.stderr)
            _note(notes, f"kvikio failed (gds not run): its wheels did not install: {why}")
    return 0


def _source_files() -> list[tuple[str, Path]]:
    """(module name, file) of every module of the project's packages (not `__main__`, which
    runs the CLI), and the check's scripts by file."""
    out = []
    for pkg in PACKAGES:
        for f in sorted((REPO / pkg).rglob("*.py")):
            parts = list(f.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__main__":
                continue
            if parts[-1] == "__init__":
                parts.pop()
            out.append((".".join(parts), f))
    return out + [("", HERE / s) for s in SCRIPTS if (HERE / s).exists()]


def imported_modules() -> list[str]:
    """Every module the project's code and the check's scripts import by name (absolute
    imports, at module level or inside functions), the standard library and the project's own
    packages left out."""
    found: set[str] = set()
    for _, f in _source_files():
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module)
    skip = set(sys.stdlib_module_names) | set(PACKAGES) | {"__future__"}
    return sorted(m for m in found if m.split(".")[0] not in skip)


def _sides() -> tuple[set[str], set[str]]:
    """(what the run loads, what only kvikio loads), as distribution names."""
    core = _closure(_project_names(), {}, {})
    return core, _closure(list(KVIKIO), {}, {}) - core


def _top_levels(dists: set[str]) -> set[str]:
    """The top-level modules of these installed distributions."""
    return {
        top
        for top, names in md.packages_distributions().items()
        if not top.startswith("_") and {canonicalize_name(n) for n in names} & dists
    }


def modules() -> tuple[list[str], list[str]]:
    """(the run's modules, kvikio's): every module of the project's packages and every module
    their code imports; kvikio's are those of kvikio's side, with the top-level modules of its
    installed dependencies (cupy where installed), imported after torch as the run does."""
    _, kv = _sides()
    kv_tops = _top_levels(kv)
    ours = [name for name, _ in _source_files() if name]
    core, kvikio = [], []
    for m in imported_modules():
        (kvikio if m.split(".")[0] in kv_tops else core).append(m)
    extra = sorted(kv_tops - {m.split(".")[0] for m in kvikio})
    return core + ours, ["torch", *kvikio, *extra]


# Run in a child: a module whose import kills the interpreter (a shared library that aborts)
# must be named, not end the verification.
_IMPORTER = """
import importlib, importlib.util, sys
for name in sys.argv[1:]:
    if importlib.util.find_spec(name.split(".")[0]) is None:
        print("absent", name, flush=True)
        continue
    print("try", name, flush=True)
    try:
        importlib.import_module(name)
    except BaseException as e:
        print("fail", name, type(e).__name__ + ": " + " ".join(str(e).split())[:300], flush=True)
print("done", flush=True)
"""


def try_imports(names: list[str]) -> tuple[list[str], list[str]]:
    """(problems, absent): each module of `names` that does not import, and why; the modules
    whose top-level package is not installed at all (optional ones, such as deepspeed; a
    missing requirement is the requirement check's to report)."""
    p = subprocess.run(
        [sys.executable, "-c", _IMPORTER, *names],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    failed: dict[str, list[str]] = {}  # why -> the modules that fail with it
    absent, last = [], ""
    for line in p.stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word == "absent":
            absent.append(rest)
        elif word == "try":
            last = rest
        elif word == "fail":
            name, _, why = rest.partition(" ")
            failed.setdefault(why, []).append(name)
    # One line per cause: a missing pydantic fails forty modules of bench at once.
    problems = [
        f"{names[0]} does not import ({why})"
        if len(names) == 1
        else f"{names[0]} and {len(names) - 1} more modules do not import ({why})"
        for why, names in failed.items()
    ]
    if "done" not in p.stdout.split():
        tail = (p.stderr.strip().splitlines() or [""])[-1][:200]
        problems.append(f"importing {last} ended the interpreter (exit {p.returncode}) {tail}")
    return problems, absent


_PIP_LINE = re.compile(
    r"^(?P<who>\S+) \S+ (?:requires (?P<missing>[^,]+), which is not installed"
    r"|has requirement (?P<req>.+), but you have (?P<dep>\S+) \S+)"
)


@dataclass
class Findings:
    """What `verify` found: `fatal` (the run cannot go on), `kvikio` (gds cannot run), `noted`
    (printed, not failing)."""

    fatal: list[str] = field(default_factory=list)
    kvikio: list[str] = field(default_factory=list)
    noted: list[str] = field(default_factory=list)


def classify_pip_check(
    lines: list[str], core: set[str], kv: set[str], ours: set[str], own: set[str]
) -> Findings:
    """Sort `pip check`'s lines (`core`: the distributions the run loads, `kv`: those only
    kvikio loads, `ours`: those the check installed, `own`: the machine's torch and CUDA)."""
    out = Findings()
    for line in lines:
        m = _PIP_LINE.match(line)
        who = canonicalize_name(line.split()[0]) if line.split() else ""
        dep = ""
        if m and m["missing"]:
            dep = canonicalize_name(m["missing"].split("[")[0].strip())
        elif m:
            dep = canonicalize_name(m["dep"])
        text = f"pip check: {line.rstrip('.')}"
        # A requirement on the machine's torch or CUDA packages (absent off a GPU machine),
        # or one of theirs that the check did not upset, is theirs to keep.
        if dep in own or (who in own and dep not in ours):
            out.noted.append(f"{text} (the machine's own torch/CUDA: the imports decide)")
        elif who in kv or (who not in core and dep in kv):
            out.kvikio.append(text)
        elif who in core or dep in core or {who, dep} & ours:
            out.fatal.append(text)
        else:
            out.noted.append(f"{text} (not loaded by the check)")
    return out


def pip_check() -> list[str]:
    """`pip check`'s complaints about this environment (the base and what PYTHONPATH adds), one
    line each."""
    p = subprocess.run(
        [sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=120
    )
    if p.returncode == 0:
        return []
    lines = [ln.strip() for ln in p.stdout.splitlines() if ln.strip()]
    if not lines:
        why = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
        return [f"pip did not run its check ({why})"]
    return lines


def verify(site: Path | None) -> Findings:
    """What is wrong with this environment for the check (see the module's docstring)."""
    core, kv = _sides()
    ours = (
        {canonicalize_name(d.metadata["Name"]) for d in md.distributions(path=[str(site)])}
        if site is not None
        else set()
    )
    out = classify_pip_check(pip_check(), core, kv, ours, machine_own())
    for r in project_requirements():
        have = installed(r.name)
        if canonicalize_name(r.name) == "torch":
            continue
        if have is None:
            out.fatal.append(f"{r.name} is missing (needed: {r})")
        elif not _meets(r, have):
            out.fatal.append(f"{r.name} {have} does not meet {r}")
    for dist in KVIKIO:
        if installed(dist) is None:
            out.kvikio.append(f"{dist} is not installed")
    run_mods, kv_mods = modules()
    problems, absent = try_imports(run_mods)
    out.fatal += problems
    if absent:
        out.noted.append(f"not imported, not installed: {', '.join(absent)}")
    if not out.kvikio:  # a kvikio that is not there need not be imported to fail
        problems, absent = try_imports(kv_mods)
        out.kvikio += problems
        if absent:
            out.noted.append(f"not imported, not installed: {', '.join(absent)}")
    return out


def report(found: Findings, notes: Path | None) -> int:
    """Print the findings, one line each; the kvikio ones also into `notes`. The exit code."""
    for p in found.noted:
        print(f"gpu_env: note: {p}")
    for p in found.fatal:
        print(f"gpu_env: {p}", file=sys.stderr)
    for p in found.kvikio:
        print(f"gpu_env: kvikio: {p}", file=sys.stderr)
        _note(notes, f"kvikio failed (gds not run): {p}")
    if found.fatal:
        return FATAL
    if found.kvikio:
        return KVIKIO_ONLY
    return 0


def make_base(venv: Path) -> list[str]:
    """A venv whose site holds only the base's distributions (not the gpu-only ones) and what
    they require, taken from this python's own installation through links: the GPU machine's
    documented python3 without anything else this machine has. Returns the distributions."""
    todo = base_names(gpu=False)
    seen: dict[str, md.Distribution] = {}
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            raise SystemExit(
                f"gpu_env: {name} (scripts/gpu-base.txt) is not installed here"
            ) from None
        seen[name] = dist
        todo += [canonicalize_name(r.name) for r in _requires(name)]
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = f"python{sys.version_info.major}.{sys.version_info.minor}"
    # Linked into the venv's own site-packages: libraries such as cuda.pathfinder look for
    # shared objects (libcufile) in the site-packages folders, not along sys.path.
    site = venv / "lib" / py / "site-packages"
    here = Path(sysconfig.get_paths()["purelib"])
    for dist in seen.values():
        for top in {Path(str(f)).parts[0] for f in dist.files or []}:
            src = here / top
            if top in ("..", "__pycache__") or not src.exists() or (site / top).exists():
                continue
            (site / top).symlink_to(src)
    return sorted(seen)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("needs")
    r = sub.add_parser("beyond")
    r.add_argument("wheels", type=Path, nargs="+")
    sub.add_parser("have")
    p = sub.add_parser("plan")
    p.add_argument("wheels", type=Path)
    i = sub.add_parser("install")
    i.add_argument("wheels", type=Path)
    i.add_argument("site", type=Path)
    i.add_argument("--notes", type=Path, help="append what failed here, for the table")
    v = sub.add_parser("verify")
    v.add_argument("--site", type=Path, help="the folder the check installed into")
    v.add_argument("--notes", type=Path, help="append what failed here, for the table")
    sub.add_parser("modules")
    b = sub.add_parser("base")
    b.add_argument("venv", type=Path)
    args = ap.parse_args()
    if args.cmd == "needs":
        print("\n".join(needs()))
    elif args.cmd == "beyond":
        print("\n".join(beyond_base(args.wheels)))
    elif args.cmd == "have":
        print("\n".join(have()))
    elif args.cmd == "plan":
        pl = plan(args.wheels)
        for part, wheels in (("core", pl.core), ("kvikio", pl.kvikio)):
            for w in wheels:
                why = pl.why.get(w.name, "absent from the base")
                print(f"{part:6} {w.path.name}  # {why}")
        for why in pl.unmet:
            print(f"unmet  {why}")
    elif args.cmd == "install":
        return install(args.wheels, args.site, args.notes)
    elif args.cmd == "verify":
        return report(verify(args.site), args.notes)
    elif args.cmd == "modules":
        run_mods, kv_mods = modules()
        print("the run's: " + " ".join(run_mods))
        print("kvikio's: " + " ".join(kv_mods))
    else:
        names = make_base(args.venv)
        print(f"base of {len(names)} distributions: {', '.join(names)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
