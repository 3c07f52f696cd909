"""kvikio as gds loads and asks it: importing it with its submodules, whether it can run here,
its mode and the reasons it prefers compat mode (made again by its own checks), its errors and
futures."""

from __future__ import annotations

import ctypes
import errno
import importlib
import os
from typing import Any

import torch


def import_kvikio() -> Any:
    """The kvikio package with the submodules the engine uses: `import kvikio` alone does not
    make `kvikio.defaults` or `kvikio.cufile_driver` attributes of the package."""
    import kvikio  # optional extra
    import kvikio.cufile_driver
    import kvikio.defaults

    return kvikio


def _one_line(e: BaseException, limit: int = 200) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())}"[:limit]


def kvikio_load_error() -> str | None:
    """None if kvikio and its submodules import here, else why not. Any failure counts, not only
    ImportError: libkvikio loads libcufile through cuda.pathfinder, which raises its own error
    (a RuntimeError) when the library is missing."""
    try:
        import_kvikio()
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] in ("kvikio", "libkvikio"):
            return f"kvikio is not installed ({e})"
        return f"kvikio does not load ({_one_line(e)})"
    except Exception as e:  # a library it loads is missing or broken
        return f"kvikio does not load ({_one_line(e)})"
    return None


def kvikio_unavailable() -> str | None:
    """None if kvikio imports and can do I/O here, else why not."""
    if not torch.cuda.is_available():
        return "no CUDA device: kvikio needs libcuda.so.1"
    return kvikio_load_error()


def kvikio_mode(kvikio: Any) -> str:
    """`gds` if kvikio can use cuFile with the nvidia-fs driver loaded, else `compat` (a
    property of the machine; a save's own label also depends on its files, see `Gds`)."""
    return "gds" if _global_reason(kvikio) is None else "compat"


# kvikio's own reasons to prefer compat mode (its `defaults::compat_mode()` documentation and
# `is_cufile_available()`, cpp/src/shim/cufile.cpp and cpp/src/shim/utils.cpp, 26.x): compat mode
# asked for (KVIKIO_COMPAT_MODE), or in AUTO: libcufile.so.0 does not load, /run/udev is not a
# directory (a container started without `--volume /run/udev:/run/udev:ro`), or WSL (the kernel
# release names Microsoft). Python sees only the verdict (`is_compat_mode_preferred`); the
# checks are made again here, the same way, to name the reason.
RUN_UDEV = "/run/udev"
LIBCUFILE = "libcufile.so.0"


def _compat_asked(kvikio: Any) -> bool:
    """kvikio's compat mode is ON (not AUTO): asked for by KVIKIO_COMPAT_MODE or its defaults."""
    try:
        mode = kvikio.defaults.get("compat_mode")
        name = getattr(mode, "name", None) or kvikio.CompatMode(int(mode)).name
    except Exception:  # an older kvikio: the environment variable says it
        name = os.environ.get("KVIKIO_COMPAT_MODE", "").upper()
    return name == "ON"


def _libcufile_error() -> str | None:
    """None if libcufile loads the way kvikio loads it (dlopen of its soname), else why not."""
    try:
        ctypes.CDLL(LIBCUFILE)
    except OSError as e:
        return " ".join(str(e).split())[:160]
    return None


def _run_udev_readable() -> bool:
    return os.path.isdir(RUN_UDEV)


def _in_wsl() -> bool:
    return "icrosoft" in os.uname().release


def compat_reasons(kvikio: Any) -> list[str]:
    """Why kvikio prefers compat mode, by its own checks (empty: none of them holds)."""
    if _compat_asked(kvikio):
        return ["compat mode is asked for (KVIKIO_COMPAT_MODE=ON or set in kvikio.defaults)"]
    out = []
    why = _libcufile_error()
    if why is not None:
        out.append(f"{LIBCUFILE} does not load ({why})")
    if not _run_udev_readable():
        out.append(
            f"{RUN_UDEV} is not a readable directory, which cuFile needs (in a container: "
            "start it with --volume /run/udev:/run/udev:ro)"
        )
    if _in_wsl():
        out.append("running in WSL, where kvikio does not use cuFile")
    return out


def _global_reason(kvikio: Any) -> str | None:
    try:
        if kvikio.defaults.is_compat_mode_preferred():
            why = "; ".join(compat_reasons(kvikio)) or "none of its own checks says why"
            return f"kvikio prefers compat mode: {why}"
        if not kvikio.cufile_driver.properties.is_gds_available:
            return "the nvidia-fs driver is not loaded (cuFile can only do POSIX I/O)"
    except Exception as e:  # any failure to tell means we cannot claim GDS
        return f"kvikio cannot tell whether GDS is available ({_one_line(e)})"
    return None


def _cufile_allows_compat(kvikio: Any) -> bool:
    try:
        return bool(kvikio.cufile_driver.properties.allow_compat_mode)
    except Exception:  # unknown: assume cuFile may fall back
        return True


def _memory_fn(kvikio: Any, name: str) -> Any:
    """kvikio.memory_register / memory_deregister (top level from 26.04, kvikio.buffer before)."""
    fn = getattr(kvikio, name, None)
    if fn is None:
        fn = getattr(importlib.import_module("kvikio.buffer"), name)
    return fn


def _io_choice(options: dict[str, Any]) -> str:
    """The back end `auto` resolves to for these options."""
    io = options.get("io", "auto")
    if io != "auto":
        return io
    dev = options.get("device", "auto")
    cuda = dev == "cuda" or (dev == "auto" and torch.cuda.is_available())
    return "kvikio" if cuda else "emulated"


def _kvikio_error(e: BaseException, path: str) -> OSError:
    """A failed kvikio I/O call (a C++ exception: RuntimeError in Python) as the OSError it is,
    naming the file, so that the sweep records an error row rather than a bug."""
    if isinstance(e, OSError):
        return e
    return OSError(errno.EIO, f"kvikio: {' '.join(str(e).split())[:300]}", path)


def _wait_all(futures: list[Any], paths: list[str]) -> list[int]:
    """Bytes moved by each kvikio future (None: never issued, counted -1), waiting for every
    one; then the first error, if any, as an OSError naming its file."""
    done: list[int] = []
    error: OSError | None = None
    for f, path in zip(futures, paths, strict=True):
        if f is None:
            done.append(-1)
            continue
        try:
            done.append(f.get())
        except (RuntimeError, OSError) as e:  # raised once all are done
            error = error or _kvikio_error(e, path)
            done.append(-1)
    if error is not None:
        raise error
    return done
