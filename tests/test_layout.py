"""The layering of DESIGN.md, checked by parsing every import of the package (not asserted in prose).

Layers, lowest first; a module may import its own layer and those below, never one above:

    0 core         data model, log-probs, losses, tokenizers/renderers, checkpoints primitives, metrics, reports
    1 models, envs the models (TinyTransformer, the HF adapter) and the environments, side by side
    2 engine       the engine and its strategies, resume, the loop template, generation backends, fault limits
    3 rollout      episodes -> trajectories, collect, datasets
    4 algorithms   the training loops
    5 stages       the stage runner
    6 experiments  the seed experiments and the HF recipes
    7 cli          the command line
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "trajtune"

LAYERS = [
    ["trajectory", "logprobs", "config", "metrics", "report", "checkpoint", "text", "objectives", "evaluation",
     "sampling", "recipes", "processes"],
    ["models", "envs", "adapters"],
    ["distributed", "engine", "resume", "loop", "generation", "faults", "episodes"],
    ["rollout", "collect", "data", "rewards", "async_sampler"],
    ["algorithms"],
    ["stages"],
    ["experiments"],
    ["cli", "hf_front", "gym_cli", "chat_cli", "__main__", "view"],
]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}

# what some layers must not reach even below them (DESIGN.md, "the separation may not")
FORBIDDEN = {
    "objectives": {"engine", "distributed", "rollout", "collect", "sampling", "generation", "models", "envs"},
    "algorithms": {"models", "envs", "rollout", "collect", "sampling", "generation", "distributed"},
    "envs": {"models", "engine", "sampling", "generation", "distributed", "algorithms"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every trajtune module `path` imports (relative imports resolved; `from . import x` -> trajtune.x)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "trajtune"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] != "trajtune":
                continue
            if node.module is None or module == "trajtune":  # from . import distributed
                found |= {f"{module}.{a.name}" for a in node.names}
            else:
                found.add(module)
    return found


def top(module: str) -> str:
    """trajtune.algorithms.rl -> algorithms; trajtune -> '' (the package itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


MODULES = sorted(ROOT.rglob("*.py"))


def test_every_module_has_a_layer():
    missing = sorted({top(module_name(p)) for p in MODULES} - set(RANK) - {""})
    assert not missing, f"place these in LAYERS: {missing}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_no_module_imports_one_above_it(path):
    me = top(module_name(path))
    if not me:
        return
    upward = sorted(m for m in imports(path) if top(m) and RANK.get(top(m), -1) > RANK[me])
    assert not upward, f"{module_name(path)} (layer {RANK[me]}) imports a higher layer: {upward}"
    banned = sorted(m for m in imports(path) if top(m) in FORBIDDEN.get(me, ()))
    assert not banned, f"{module_name(path)} must not import {banned} ({me} never reaches them)"


def test_the_check_catches_an_upward_import(tmp_path, monkeypatch):
    """The parser sees relative, absolute and `from . import` forms (a check that cannot fail is no check)."""
    fake = ROOT / "algorithms" / "_layout_probe.py"
    source = "from ..experiments import agent\nfrom trajtune.cli import main\nfrom .. import stages\nfrom ..models import tiny\n"
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: source if self == fake else Path.read_bytes(self).decode())
    found = imports(fake)
    assert {"trajtune.experiments", "trajtune.cli", "trajtune.stages", "trajtune.models"} <= found
    with pytest.raises(AssertionError, match="imports a higher layer"):
        test_no_module_imports_one_above_it(fake)
