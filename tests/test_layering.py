"""The floors of the package stay apart (STYLE 4, 16): every import of every module under ``src/levjepa`` —
function-local and ``TYPE_CHECKING`` ones included, read from the ``ast`` — goes down the layer table
below or stays inside its own unit, and ``torch.distributed`` is touched by ``levjepa/distributed.py`` only.
Likewise every seed goes through ``levjepa/rng.py`` (STYLE 10): nothing else seeds a generator.

Two units on the same floor may not import each other either (that is how cycles start), so the table is
also the proof that the package graph has no cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# unit -> floor. A module belongs to the longest unit that names it or a package above it; the root
# ``levjepa`` (its __init__: the version and lazily resolved names) is its own unit.
LAYERS: dict[str, int] = {
    # foundations: typed configs, explicit randomness, the on-disk contract, the only torch.distributed user
    "levjepa": 0,
    "levjepa.config": 0,
    "levjepa.rng": 0,
    "levjepa.weights": 0,
    "levjepa.distributed": 0,
    # the science: clips and views, the encoder, the objectives
    "levjepa.data": 1,
    "levjepa.model": 1,
    "levjepa.objective": 1,
    # what runs them: the training loop, the streaming encoder
    "levjepa.train": 2,
    "levjepa.infer": 2,
    # weights in and out: levjepa runs and exports, the official checkpoints, the hub layout
    "levjepa.formats": 3,
    # frozen evaluation; named pretraining presets
    "levjepa.eval": 4,
    "levjepa.presets": 4,
    # tools over trained encoders and configs
    "levjepa.tools": 5,
    # the command line: every subcommand and the dispatch
    "levjepa.commands": 6,
    # the console script and `python -m levjepa`
    "levjepa.cli": 7,
    "levjepa.__main__": 7,
}
DISTRIBUTED_OWNER = "levjepa.distributed"


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _unit(module: str) -> str | None:
    if module == "levjepa":
        return module
    found = [u for u in LAYERS if u != "levjepa" and (module == u or module.startswith(u + "."))]
    return max(found, key=len) if found else None


def _imports(module: str, is_package: bool, tree: ast.AST, modules: set[str]) -> list[tuple[int, str]]:
    """(line, imported module) for every import in ``tree``, relative ones resolved; ``from X import y`` is
    read as ``X.y`` (inside levjepa only when that is a module: ``y`` may be a function of ``X``)."""
    package = module if is_package else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                inside = base == "levjepa" or base.startswith("levjepa.")
                out.append((node.lineno, base if inside and full not in modules else full))
    return out


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return None


def violations(sources: dict[str, tuple[bool, str]]) -> list[str]:
    """Every layering break in ``sources`` (module -> (is a package __init__, source text))."""
    modules = set(sources)
    found = []
    for module, (is_package, text) in sorted(sources.items()):
        tree = ast.parse(text)
        unit = _unit(module)
        if unit is None:
            found.append(f"{module}: not in the layer table of tests/test_layering.py (add its floor)")
            continue
        for line, target in _imports(module, is_package, tree, modules):
            if (target == "torch.distributed" or target.startswith("torch.distributed.")) and (
                module != DISTRIBUTED_OWNER
            ):
                found.append(f"{module}:{line} imports {target}: only {DISTRIBUTED_OWNER} may")
            if target != "levjepa" and not target.startswith("levjepa."):
                continue
            other = _unit(target)
            if other is None or other == unit:
                continue
            if LAYERS[other] >= LAYERS[unit]:
                where = "above" if LAYERS[other] > LAYERS[unit] else "beside"
                found.append(
                    f"{module}:{line} imports {target}: {other} (floor {LAYERS[other]}) is {where} {unit} "
                    f"(floor {LAYERS[unit]})"
                )
        if module != DISTRIBUTED_OWNER:
            for node in ast.walk(tree):
                name = _dotted(node) if isinstance(node, ast.Attribute) else None
                if name == "torch.distributed":
                    found.append(f"{module}:{node.lineno} uses torch.distributed: only {DISTRIBUTED_OWNER} may")
    return found


def _package_sources() -> dict[str, tuple[bool, str]]:
    return {
        _module_name(path, SRC): (path.name == "__init__.py", path.read_text())
        for path in sorted((SRC / "levjepa").rglob("*.py"))
    }


def test_every_import_goes_down_the_layer_table():
    sources = _package_sources()
    assert len(sources) > 60 and "levjepa.commands" in sources and "levjepa.model.vit" in sources
    assert violations(sources) == []


def test_the_check_catches_upward_sideways_and_distributed_imports():
    def one(module: str, text: str, is_package: bool = False) -> list[str]:
        return violations({module: (is_package, text), "levjepa.train.loop": (False, "")})

    assert one("levjepa.model.vit", "def f():\n    from levjepa.train import loop\n")  # function-local, upward
    assert one("levjepa.data.views", "from levjepa.model import vit\n")  # beside: same floor, other unit
    assert one("levjepa.formats.load", "from ..commands import probe\n")  # relative, upward
    assert one("levjepa.objective.sigreg", "import torch.distributed as dist\n")
    assert one("levjepa.objective.sigreg", "from torch import distributed\n")
    assert one("levjepa.model.vit", "import torch\nok = torch.distributed.is_initialized()\n")
    assert one("levjepa.newthing", "")  # a module the table does not place
    assert not one("levjepa.formats.load", "from levjepa.train.loop import build_models\nfrom . import features\n")
    assert not one("levjepa.distributed", "import torch.distributed as dist\n")


RNG_OWNER = "levjepa.rng"
SEEDING = ("manual_seed", "seed", "Generator", "set_rng_state")  # calls that seed or build a generator


def seeding_outside_rng(sources: dict[str, tuple[bool, str]]) -> list[str]:
    """Every ``torch.manual_seed`` / ``g.manual_seed`` / ``torch.Generator(...)`` / ``set_rng_state`` call outside
    ``levjepa.rng`` (checkpoints hold no RNG state: nothing in a run draws from the global one)."""
    found = []
    for module, (_, text) in sorted(sources.items()):
        if module == RNG_OWNER:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in SEEDING:
                found.append(f"{module}:{node.lineno} calls .{node.func.attr}(): seed through levjepa.rng")
    return found


def test_every_seed_goes_through_rng():
    assert seeding_outside_rng(_package_sources()) == []
    caught = seeding_outside_rng({"levjepa.data.x": (False, "import torch\ng = torch.Generator().manual_seed(3)\n")})
    assert len(caught) == 2  # the Generator and its manual_seed
