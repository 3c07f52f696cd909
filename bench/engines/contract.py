"""For mypy only (nothing imports this module): each registered engine class, held to the
engine contract (bench.engines.base.Engine). `bench.engines.REGISTRY` promises a `type[Engine]`
of a class it imports by name, which mypy cannot follow; here it checks each class against the
protocol: its class variables, classmethods, methods and their signatures.

Imports: the engines (every one; being imported by none, it closes no import circle).
"""

from __future__ import annotations

from bench.engines.base import Engine
from bench.engines.cpu_double import CpuDouble
from bench.engines.cpu_single import CpuSingle
from bench.engines.dcp import Dcp
from bench.engines.dlio_style import DlioStyle
from bench.engines.fastpersist import FastPersist
from bench.engines.gds import Gds
from bench.engines.gds.parts import GdsEngine
from bench.engines.nixl_peer import Nixl
from bench.engines.safetensors_save import Safetensors
from bench.engines.torch_save import TorchSave

# One line per line of bench.engines.registry.ENGINES.
CONTRACT: dict[str, type[Engine]] = {
    "gds": Gds,
    "cpu-single": CpuSingle,
    "cpu-double": CpuDouble,
    "torch-save": TorchSave,
    "dcp": Dcp,
    "safetensors": Safetensors,
    "fastpersist": FastPersist,
    "dlio-style": DlioStyle,
    "nixl": Nixl,
}


def gds_jobs_see_the_engine(engine: Gds) -> GdsEngine:
    """gds's job modules take the engine as a GdsEngine (bench.engines.gds.parts): mypy holds
    the class to every member they use."""
    return engine
