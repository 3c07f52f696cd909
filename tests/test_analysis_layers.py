"""analysis/'s layout: its modules import one way, from the ground up, each only from an earlier
layer, so that nothing imports in circles."""

from __future__ import annotations

from pathlib import Path

# analysis' modules from the ground up: each may import only those of an earlier layer (every
# import counts, a function's own included), so that a reader finds each job by its name and
# nothing imports in circles. A new module joins the layer its imports put it in.
LAYERS = [
    ["tables", "runs", "external"],
    ["stats", "cost", "scaling", "mlperf", "stragglers"],
    ["training", "model.profiles"],
    ["model.predict"],
    ["model.host", "model.planning", "model.calibrate", "model.published"],
    ["model.render", "contention"],
    ["summary", "figures.common"],
    ["figures.*", "report.doc", "report.captions"],
    ["report.host", "report.caveats", "report.summary", "report.model", "report.environment"]
    + ["report.glossary", "report.tuning", "report.stragglers"]
    + ["report.training", "report.contention", "report.scaling", "report.restore", "report.mlperf"],
    ["report.answer", "compare"],
    ["report.build"],
]


def _analysis_imports() -> dict[str, set[str]]:
    """Every module of analysis/ (dotted, without `analysis.`) and the analysis modules it
    imports anywhere in its file."""
    import ast

    root = Path(__file__).parent.parent / "analysis"
    out: dict[str, set[str]] = {}
    for f in sorted(root.rglob("*.py")):
        parts = f.relative_to(root).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        deps: set[str] = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("analysis"):
                if node.module == "analysis":
                    deps |= {a.name for a in node.names}
                else:
                    deps.add(node.module.removeprefix("analysis."))
            elif isinstance(node, ast.Import):
                deps |= {
                    a.name.removeprefix("analysis").removeprefix(".")
                    for a in node.names
                    if a.name == "analysis" or a.name.startswith("analysis.")
                }
        out[name] = deps - {name}
    return out


def test_analysis_imports_run_one_way() -> None:
    imports = _analysis_imports()

    def layer(module: str) -> int:
        for i, names in enumerate(LAYERS):
            if module in names or (module.startswith("figures.") and "figures.*" in names):
                return i
        raise AssertionError(f"analysis.{module} is in no layer of LAYERS: add it")

    packages = {"", "model", "figures", "report"}  # their __init__ holds a docstring only
    upward = [
        f"analysis.{m} imports analysis.{d}"
        for m, deps in imports.items()
        if m not in packages
        for d in deps
        if d in packages or layer(d) >= layer(m)
    ]
    assert upward == []
    assert all(not imports[p] for p in packages if p in imports)
