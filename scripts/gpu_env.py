"""The GPU check's Python environment: what the machine's python3 lacks, and whether the result
holds together. Used by scripts/gpu_wheels.sh, scripts/gpu_check.sh and its rehearsal.

    python scripts/gpu_env.py needs                  # requirements the base does not hold
    python scripts/gpu_env.py beyond WHEEL...        # their requirements the base lacks
    python scripts/gpu_env.py have                   # the base's versions here
    python scripts/gpu_env.py missing WHEELS_DIR     # wheels whose distribution is absent here
    python scripts/gpu_env.py verify                 # every requirement met, kvikio imports
    python scripts/gpu_env.py base VENV              # the rehearsal's base (see `make_base`)

The base is the image's documented packages (scripts/gpu-base.txt). The check installs the
missing wheels with `pip install --target`, not into a venv: the machine's python3 is itself a
venv (/opt/torch/.venv), and a venv made from it with --system-site-packages would see the
interpreter's own site-packages, not that venv's torch.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import tomllib
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BASE_FILE = HERE / "gpu-base.txt"
# kvikio's requirements that the GPU machine meets with its own CUDA packages (documented in
# the base as gpu-only) or that the check does not need; the rest are checked.
KVIKIO = ("kvikio-cu13", "libkvikio-cu13")


def base_names(gpu: bool = True) -> list[str]:
    """The distributions of scripts/gpu-base.txt (without the gpu-only ones when `gpu` is
    false)."""
    out = []
    for line in BASE_FILE.read_text().splitlines():
        words = line.split("#", 1)[0].split()
        if words and (gpu or "gpu-only" not in words[1:]):
            out.append(canonicalize_name(words[0]))
    return out


def project_requirements() -> list[Requirement]:
    with open(REPO / "pyproject.toml", "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    return [Requirement(d) for d in deps]


def _applies(req: Requirement) -> bool:
    env = {**default_environment(), "extra": ""}
    return req.marker is None or req.marker.evaluate(env)


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


def missing(wheels: Path) -> list[Path]:
    """The wheels in `wheels` whose distribution this python does not have at all."""
    return sorted(w for w in wheels.glob("*.whl") if installed(_wheel_name(w)) is None)


def _requires(dist: str) -> list[Requirement]:
    """The requirements of an installed distribution that apply here (no extras)."""
    return [r for r in map(Requirement, md.distribution(dist).requires or []) if _applies(r)]


def wheel_requires(wheel: Path) -> list[str]:
    """The Requires-Dist lines of a wheel's own metadata."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    return [ln.split(": ", 1)[1] for ln in text.splitlines() if ln.startswith("Requires-Dist: ")]


def verify() -> list[str]:
    """What is wrong with this environment for the check: a requirement of the project or of
    kvikio (except the gpu-only ones) not met, or kvikio not importing with its submodules."""
    gpu_only = set(base_names()) - set(base_names(gpu=False))
    wanted = [r for r in project_requirements() if canonicalize_name(r.name) != "torch"]
    for dist in KVIKIO:
        if installed(dist) is None:
            return [f"{dist} is not installed"]
        wanted += [r for r in _requires(dist) if canonicalize_name(r.name) not in gpu_only]
    problems = []
    for r in wanted:
        have = installed(r.name)
        if have is None:
            problems.append(f"{r.name} is missing (needed: {r})")
        elif r.specifier and not r.specifier.contains(Version(have), prereleases=True):
            problems.append(f"{r.name} {have} does not meet {r}")
    if not problems:
        try:
            import kvikio
            import kvikio.cufile_driver
            import kvikio.defaults  # noqa: F401
        except Exception as e:  # noqa: BLE001 - any failure to load is the finding
            problems.append(f"kvikio does not import ({type(e).__name__}: {e})")
    return problems


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
    m = sub.add_parser("missing")
    m.add_argument("wheels", type=Path)
    r = sub.add_parser("beyond")
    r.add_argument("wheels", type=Path, nargs="+")
    sub.add_parser("have")
    sub.add_parser("verify")
    b = sub.add_parser("base")
    b.add_argument("venv", type=Path)
    args = ap.parse_args()
    if args.cmd == "needs":
        print("\n".join(needs()))
    elif args.cmd == "beyond":
        print("\n".join(beyond_base(args.wheels)))
    elif args.cmd == "have":
        print("\n".join(have()))
    elif args.cmd == "missing":
        print("\n".join(str(p) for p in missing(args.wheels)))
    elif args.cmd == "verify":
        problems = verify()
        for p in problems:
            print(f"gpu_env: {p}", file=sys.stderr)
        return 2 if problems else 0
    else:
        names = make_base(args.venv)
        print(f"base of {len(names)} distributions: {', '.join(names)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
