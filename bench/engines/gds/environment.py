"""The environment block gds adds to env.json (`kvikio`): kvikio's and cuFile's versions, the
mode kvikio would use, where a save's label comes from, kvikio's settings."""

from __future__ import annotations

from typing import Any

import torch

from bench.engines.gds import kvikio_lib, labels


def kvikio_info() -> dict[str, Any]:
    """kvikio and cuFile versions and the mode kvikio would use; absent when it cannot load. The
    engine's block of the environment (env.json `kvikio`), registered in bench.engines."""
    if not torch.cuda.is_available():
        return {"available": False, "reason": "no CUDA device (kvikio needs libcuda.so.1)"}
    why = kvikio_lib.kvikio_load_error()  # any failure to load, not only ImportError
    if why is not None:
        return {"available": False, "reason": why}
    kvikio = kvikio_lib.import_kvikio()
    counters = labels.nvfs_counters()
    info: dict[str, Any] = {
        "available": True,
        "version": getattr(kvikio, "__version__", None),
        "mode": kvikio_lib.kvikio_mode(kvikio),
        # where a save's gds label comes from: nvidia-fs's byte counters, or the filesystem list
        "nvidia_fs_stats": "absent"
        if counters is None
        else "bytes counted"
        if "write_MiB" in counters
        else "IO statistics off",
    }

    def props() -> Any:
        return kvikio.cufile_driver.properties

    for key, fn in [
        ("compat_mode", lambda: getattr(kvikio.defaults.get("compat_mode"), "name", None)),
        ("num_threads", lambda: kvikio.defaults.get("num_threads")),
        ("task_size", lambda: kvikio.defaults.get("task_size")),
        ("gds_threshold", lambda: kvikio.defaults.get("gds_threshold")),
        ("libcufile_version", lambda: kvikio.cufile_driver.libcufile_version()),
        ("nvidia_fs_available", lambda: bool(props().is_gds_available)),
        ("nvidia_fs_version", lambda: f"{props().major_version}.{props().minor_version}"),
        ("cufile_allow_compat_mode", lambda: bool(props().allow_compat_mode)),
    ]:
        try:
            info[key] = fn()
        except Exception as e:  # record, never fail the run for it
            info[key] = f"unknown ({type(e).__name__})"
    return info
