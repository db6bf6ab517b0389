"""The floors of the package stay apart (STYLE 4, 16): every import of every module under ``src/levjepa`` —
function-local and ``TYPE_CHECKING`` ones included, read from the ``ast`` — goes down the layer table
below or stays inside its own unit, and ``torch.distributed`` is touched by ``levjepa/distributed.py`` only.
Likewise every seed goes through ``levjepa/rng.py`` (STYLE 10): nothing else seeds a generator.

Two units on the same floor may not import each other either (that is how cycles start), so the table is
also the proof that the package graph has no cycle. Inside a unit the files may import each other, but
never in a circle (:func:`file_cycles`: a cycle hidden behind function-local imports is a cycle too), and no
module reaches into another module's private names (:func:`private_imports`: ``from levjepa.x.y import _z``
or ``y._z`` on an imported module), since a name with a leading underscore can change without notice.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# unit -> floor. A module belongs to the longest unit that names it or a package above it; the root
# ``levjepa`` (its __init__: a face of lazily resolved names over every floor) is its own unit, on top: at
# import time it imports levjepa.version only, and nothing in the package imports it.
LAYERS: dict[str, int] = {
    # foundations: what levjepa is (version, torch floor), typed configs, explicit randomness, the on-disk
    # contract, the only torch.distributed user
    "levjepa.version": 0,
    "levjepa.config": 0,
    "levjepa.rng": 0,
    "levjepa.threads": 0,
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
    # frozen features on disk (the feature-set format, stores, extraction, codecs, readouts), beside the weights
    # formats and read by eval: neither imports the other
    "levjepa.features": 3,
    # frozen evaluation; named pretraining presets
    "levjepa.eval": 4,
    "levjepa.presets": 4,
    # tools over trained encoders and configs
    "levjepa.tools": 5,
    # end-to-end fine-tuning of an encoder + head (reads labelled data through eval)
    "levjepa.finetune": 5,
    # the command line: every subcommand and the dispatch
    "levjepa.commands": 6,
    # the console script and `python -m levjepa`
    "levjepa.cli": 7,
    "levjepa.__main__": 7,
    # the face: levjepa.load, levjepa.from_pretrained, ... resolved on first use
    "levjepa": 8,
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
    read as ``X.y`` (inside levjepa only when that is a module: ``y`` may be a function of ``X``). A module
    loaded by name — ``importlib.import_module("levjepa.x")``, or ``import_module(f"levjepa.x.{name}")``
    (the package it picks from) — is an import too: loading by name is still depending on it."""
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
        elif isinstance(node, ast.Call) and (_dotted(node.func) or "").endswith("import_module") and node.args:
            name = _module_string(node.args[0])
            if name is not None and (name == "levjepa" or name.startswith("levjepa.")):
                out.append((node.lineno, name))
    return out


def _module_string(node: ast.AST) -> str | None:
    """The module an ``import_module`` argument names: a string, or the constant head of an f-string
    (``f"levjepa.commands.{name}"`` -> ``levjepa.commands``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        return str(node.values[0].value).rstrip(".")
    return None


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


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module an ``ImportFrom`` names (relative imports resolved)."""
    base = node.module or ""
    if node.level:
        anchor = (module if is_package else module.rpartition(".")[0]).split(".")
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
    return base


def file_cycles(sources: dict[str, tuple[bool, str]]) -> list[str]:
    """Every import cycle between modules of ``sources`` (function-local imports included), one line each.
    A package's ``__init__`` importing its own modules is not an edge back: ``from levjepa.data import x``
    inside ``levjepa.data`` is read as the module ``levjepa.data.x`` when there is one."""
    modules = set(sources)
    graph: dict[str, set[str]] = {}
    for module, (is_package, text) in sources.items():
        targets = {t for _, t in _imports(module, is_package, ast.parse(text), modules)}
        graph[module] = {t for t in targets if t in modules and t != module}
    found, state, stack = [], {}, []

    def visit(m: str) -> None:
        state[m] = "open"
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == "open":
                cycle = [*stack[stack.index(t) :], t]
                found.append(" -> ".join(cycle) + ": an import cycle (move what both need into a third module)")
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return found


def private_imports(sources: dict[str, tuple[bool, str]]) -> list[str]:
    """Every use of another levjepa module's private name: ``from M import _x`` (``_x`` not a module of the
    importer's own package) and ``m._x`` where ``m`` names an imported levjepa module."""
    modules = set(sources)
    found = []
    for module, (is_package, text) in sorted(sources.items()):
        tree = ast.parse(text)
        package = module if is_package else module.rpartition(".")[0]
        aliases: dict[str, str] = {}  # local name -> imported levjepa module
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in modules and alias.asname:
                        aliases[alias.asname] = alias.name
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(module, is_package, node)
                if not (base == "levjepa" or base.startswith("levjepa.")):
                    continue
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    if full in modules:
                        aliases[alias.asname or alias.name] = full
                    private = alias.name.startswith("_") and not alias.name.startswith("__")
                    own = full in modules and full.rpartition(".")[0] == package  # a private sibling module
                    if private and base != module and not own:
                        found.append(f"{module}:{node.lineno} imports {alias.name} from {base}: a private name")
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and aliases[node.value.id] != module
            ):
                found.append(f"{module}:{node.lineno} uses {aliases[node.value.id]}.{node.attr}: a private name")
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
    assert one("levjepa.formats.reading.load", "from ...commands import probe\n")  # relative, upward
    assert one("levjepa.objective.sigreg", "import torch.distributed as dist\n")
    assert one("levjepa.objective.sigreg", "from torch import distributed\n")
    assert one("levjepa.model.vit", "import torch\nok = torch.distributed.is_initialized()\n")
    assert one("levjepa.newthing", "")  # a module the table does not place
    # loading by name is importing: a string or the head of an f-string given to import_module
    assert one("levjepa.model.vit", 'import importlib\nimportlib.import_module("levjepa.formats.transformers.hub")\n')
    assert one("levjepa.data.views", 'from importlib import import_module\nimport_module(f"levjepa.eval.{n}")\n')
    assert not one("levjepa.commands", 'import importlib\nimportlib.import_module(f"levjepa.model.{n}")\n')
    assert not one(
        "levjepa.formats.reading.load", "from levjepa.train.loop import build_models\nfrom . import features\n"
    )
    assert not one("levjepa.distributed", "import torch.distributed as dist\n")


# To burn down, like pyproject.toml's mypy list: cycles known and owned elsewhere. An entry that no longer
# occurs fails the test too, so the list only shrinks.
KNOWN_CYCLES: set[str] = set()


def test_no_import_cycle_between_files_and_no_private_name_used_across_modules():
    sources = _package_sources()
    cycles = {c.partition(":")[0] for c in file_cycles(sources)}
    assert cycles - KNOWN_CYCLES == set()
    assert KNOWN_CYCLES - cycles == set(), "a known cycle is gone: remove it from KNOWN_CYCLES"
    assert private_imports(sources) == []


def test_the_check_catches_a_file_cycle_and_a_private_import():
    def src(**modules: str) -> dict[str, tuple[bool, str]]:
        return {name.replace("__", "."): (False, text) for name, text in modules.items()}

    cycle = src(levjepa__data__a="from levjepa.data import b\n", levjepa__data__b="def f():\n    from . import a\n")
    assert file_cycles(cycle) == ["levjepa.data.a -> levjepa.data.b -> levjepa.data.a: an import cycle (move what "
                                  "both need into a third module)"]  # fmt: skip
    assert not file_cycles(src(levjepa__data__a="from levjepa.data import b\n", levjepa__data__b=""))
    assert private_imports(
        src(levjepa__data__a="def f():\n    from levjepa.data.b import _decode\n", levjepa__data__b="")
    )
    attr = src(levjepa__data__a="import levjepa.data.b as bm\nx = bm._open\n", levjepa__data__b="")
    assert private_imports(attr) == ["levjepa.data.a:2 uses levjepa.data.b._open: a private name"]
    assert private_imports(src(levjepa__data__a="from levjepa.data import b\nx = b._open()\n", levjepa__data__b=""))
    ok = src(levjepa__objective__s="from levjepa.objective import _chunked\n", levjepa__objective___chunked="")
    assert not private_imports(ok)  # a package's own private module, imported by its sibling
    assert not private_imports(src(levjepa__data__a="from levjepa.data.b import decode\n", levjepa__data__b=""))


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
