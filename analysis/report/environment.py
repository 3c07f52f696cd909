"""The report's environment table: env.json as rows (host, CPU, device, GPU, storage, ceilings,
git, packages, config); a training-loop run's with its own config.
"""

from __future__ import annotations

from typing import Any

from bench.common.sizes import format_size
from bench.measure.ceilings import Ceilings, RunCeilings


def _ceilings_text(c: Ceilings) -> str:
    """The ceilings measured before the sweep: how, then every measurement in GB/s (its runs,
    its configuration)."""
    parts = [f"{k} {v}" for k, v in c.method.to_json().items()]
    for kind, n, m in c.measured():
        where = f"{n} target(s): " if n is not None else ""
        detail = [f"runs {' '.join(f'{r / 1e9:.2f}' for r in m.runs)} GB/s"] if m.runs else []
        detail += [kind.describe(m)] if m.writers else []
        parts.append(
            f"{where}{kind.label} {m.Bps / 1e9:.2f} GB/s"
            + (f" ({', '.join(detail)})" if detail else "")
        )
    return "; ".join(parts)


def env_rows(env: dict[str, Any]) -> list[list[str]]:
    """The environment as (key, value) rows."""
    rows: list[list[str]] = []

    def add(k: str, v: Any) -> None:
        if v not in (None, "", [], {}):
            rows.append([k, str(v)])

    cpu = env.get("cpu", {})
    add("host", env.get("host"))
    add("os / kernel", f"{env.get('os', '?')} / {env.get('kernel', '?')}")
    add("python", env.get("python"))
    add("CPU", f"{cpu.get('model', '?')}, {cpu.get('logical_cores', '?')} logical cores")
    if env.get("memory_bytes"):
        add("memory", format_size(int(env["memory_bytes"])))
    dev = env.get("device", {})
    add("device", f"{dev.get('kind', '?')}" + (" (EMULATED)" if dev.get("emulated") else ""))
    gpu = env.get("gpu", {})
    if gpu.get("present"):
        add(
            "GPU",
            f"{gpu.get('name', '?')}, driver {gpu.get('driver', '?')}, PCIe gen "
            f"{gpu.get('pcie_gen', '?')} x{gpu.get('pcie_width', '?')}",
        )
    else:
        add("GPU", "none")
    kv = env.get("kvikio", {})
    add("kvikio", ", ".join(f"{k}={v}" for k, v in kv.items()))
    st = env.get("storage", {})
    for i, t in enumerate(st.get("targets", [])):
        b = t.get("block", {})
        add(
            f"target {i}",
            f"{t.get('path')}: {t.get('fstype')} on {t.get('source')} "
            f"(disk {b.get('disk', '?')}, rotational={b.get('rotational', '?')}, "
            f"mount {t.get('mount')})",
        )
    if "shared_device" in st:
        add(
            "targets share one device",
            "YES: SSD-count scaling is not real" if st["shared_device"] else "no",
        )
    before = RunCeilings.from_env(env).before
    if before is not None:
        add("device ceilings", _ceilings_text(before))
    g = env.get("git", {})
    add("git", f"{g.get('commit', '?')}" + (" (dirty)" if g.get("dirty") else ""))
    add("packages", ", ".join(f"{k} {v}" for k, v in env.get("packages", {}).items()))
    cfg = env.get("config", {})
    if cfg:
        add(
            "config",
            f"engines {cfg.get('engines')}, total_sizes "
            f"{[format_size(s) for s in cfg.get('total_sizes', [])]}, tensor_sizes "
            f"{[format_size(s) for s in cfg.get('tensor_sizes', [])]}, models "
            f"{cfg.get('models')}, ssd_counts {cfg.get('ssd_counts')}, repetitions "
            f"{cfg.get('repetitions')}, warmups {cfg.get('warmups')}",
        )
    for n in env.get("notes", []):
        add("note", n)
    return rows


def training_env_rows(env: dict[str, Any]) -> list[list[str]]:
    """env_rows with the training config in place of the sweep's."""
    rows = [r for r in env_rows({k: v for k, v in env.items() if k != "config"})]
    cfg = env.get("config", {})
    if cfg:
        keys = (
            "engines",
            "steps",
            "checkpoint_every",
            "warmup_steps",
            "warmup_checkpoints",
            "model",
            "lr",
            "weight_decay",
            "threads",
            "seed",
            "targets",
        )
        rows.append(["config", ", ".join(f"{k} {cfg.get(k)}" for k in keys)])
    return rows
