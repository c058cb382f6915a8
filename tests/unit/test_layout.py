"""The layering of DESIGN.md, checked by parsing every import of the package (not asserted in prose).

Layers, lowest first; a module may import its own layer and those below, never one above. A
module's layer is that of the longest prefix listed (`runs.loop` is layer 2, `runs.stages` 5):

    0 core         data model, log-probs, configs, seeds, metrics, checkpoint files, losses, text, reports, audits
    1 models, envs the models (TinyTransformer, the HF adapter) and the environments, side by side
    2 engine       the engine (decoding, collectives), resume, the run's hooks (the episode recorder)
    3 sources      where trajectories come from: the episode loop, faults, sampler process, overlap,
                   rewards, datasets; evaluation (it samples through a source); the loop's Run (it
                   saves a source's episodes drawn ahead)
    4 algorithms   the training loops
    5 runner       the stage runner and the run directory
    6 experiments  the seed experiments and the HF recipes
    7 cli          the command line

Some layers must not reach some others even below them, directly or through any chain of imports
(FORBIDDEN): the algorithms see a source only through its Protocol (`sources.base`) and the one wrapper
the RL loop composes itself (`sources.refill`: DAPO's dynamic sampling, built on the Protocol alone), never the
episode loop, the environments or the models; the losses see tensors only.
"""

import ast
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "trajtune"

LAYERS = [
    ["trajectory", "logprobs", "config", "seeding", "metrics", "checkpoint", "processes", "objectives", "text",
     "recipes", "runs.report", "runs.plots", "runs.metrics_report", "runs.verdicts", "audits", "decontamination",
     "ratings"],
    ["models", "envs"],
    ["engine", "runs.resume", "runs.recorder", "runs.hooks"],
    ["sources", "evaluation", "overoptimization", "runs.loop"],
    ["algorithms", "tinker"],
    ["runs.stages", "runs.rundir", "runs"],
    ["experiments"],
    ["cli", "__main__"],
]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}

# what some layers must not reach, directly or transitively (prefixes; EXCEPT: what they may reach)
FORBIDDEN = {
    "objectives": {"engine", "sources", "models", "envs", "algorithms", "runs"},
    "algorithms": {"models", "envs", "sources", "engine.distributed", "engine.collectives", "engine.decoding",
                   "engine.generate", "engine.torch_engine"},  # the engine through its Protocol (`trajtune.engine`)
    "envs": {"models", "engine", "sources", "algorithms", "runs"},
}
EXCEPT = {"algorithms": {"sources.base", "sources.refill"}}  # the Protocol, and the refill a loop composes
TRANSITIVE = {"algorithms": {"models", "envs", "sources"}, "objectives": FORBIDDEN["objectives"],
              "envs": FORBIDDEN["envs"]}
"""forbidden reach checked through every chain of imports (the engine may reach its decoders and collectives)"""


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
            for a in node.names:  # `from pkg import submodule` imports the submodule
                sub = f"{module}.{a.name}"
                found.add(sub if (ROOT.parent / (sub.replace(".", "/") + ".py")).exists()
                          or (ROOT.parent / sub.replace(".", "/") / "__init__.py").exists() else module)
    return found


def local(module: str) -> str:
    """trajtune.algorithms.rl -> algorithms.rl; trajtune -> '' (the package itself)."""
    return module.partition(".")[2]


def prefix(module: str, names) -> str | None:
    """The longest of `names` that is `module` or a package above it (local names), else None."""
    m = local(module)
    hits = [n for n in names if m == n or m.startswith(n + ".")]
    return max(hits, key=len) if hits else None


def rank(module: str) -> int | None:
    p = prefix(module, RANK)
    return None if p is None else RANK[p]


MODULES = sorted(ROOT.rglob("*.py"))
BY_NAME = {module_name(p): p for p in MODULES}


def resolve(module: str) -> str | None:
    """The module a name refers to: itself, or (a name inside a module) the module above it."""
    while module and module not in BY_NAME:
        module = module.rpartition(".")[0]
    return module or None


@cache
def reach(module: str) -> frozenset[str]:
    """Every trajtune module `module` imports, directly or through others."""
    seen, todo = set(), [module]
    while todo:
        m = todo.pop()
        for dep in imports(BY_NAME[m]):
            dep = resolve(dep)
            if dep is not None and dep not in seen and dep != module:
                seen.add(dep)
                todo.append(dep)
    return frozenset(seen)


def banned(me: str, targets, table: dict) -> list[str]:
    """The modules of `targets` that `me`'s layer may not reach according to `table` (and EXCEPT)."""
    key = prefix(me, table)
    if key is None:
        return []
    allowed = EXCEPT.get(key, set())
    return sorted(local(t) for t in targets if prefix(t, table[key]) and not prefix(t, allowed))


def test_every_module_has_a_layer():
    missing = sorted({local(module_name(p)) for p in MODULES if local(module_name(p)) and rank(module_name(p)) is None})
    assert not missing, f"place these in LAYERS: {missing}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_no_module_imports_one_above_it(path):
    me = module_name(path)
    if not local(me):
        return
    upward = sorted(m for m in imports(path) if rank(m) is not None and rank(m) > rank(me))
    assert not upward, f"{me} (layer {rank(me)}) imports a higher layer: {upward}"
    direct = banned(me, imports(path), FORBIDDEN)
    assert not direct, f"{me} must not import {direct}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_no_module_reaches_what_its_layer_may_not_through_other_modules(path):
    me = module_name(path)
    if me not in BY_NAME or not local(me):
        return
    far = banned(me, reach(me), TRANSITIVE)
    assert not far, f"{me} reaches {far} through its imports (`python -X importtime` shows the chain)"


def test_the_check_catches_an_upward_import(tmp_path, monkeypatch):
    """The parser sees relative, absolute and `from . import` forms (a check that cannot fail is no check)."""
    fake = ROOT / "algorithms" / "_layout_probe.py"
    source = ("from ..experiments import agent\nfrom trajtune.cli import main\nfrom ..runs import stages\n"
              "from ..models import tiny\n")
    monkeypatch.setattr(Path, "read_text",
                        lambda self, *a, **k: source if self == fake else Path.read_bytes(self).decode())
    found = imports(fake)
    assert {"trajtune.experiments.agent", "trajtune.cli", "trajtune.runs.stages", "trajtune.models.tiny"} <= found
    with pytest.raises(AssertionError, match="imports a higher layer"):
        test_no_module_imports_one_above_it(fake)


PLANTS = {  # (a module, the chain of imports planted under it, what its layer may not reach)
    "algorithms": ("algorithms", "from .._probe_core import x\n", "from .sources.rollout import rollout_batch\n",
                   "sources.rollout"),
    "envs": ("envs", "from .._probe_core import x\n", "from .models.tiny import TinyTransformer\n", "models.tiny"),
}


@pytest.mark.parametrize("case", list(PLANTS))
def test_the_check_catches_what_a_module_reaches_through_another(monkeypatch, case):
    """A planted chain: a module imports a core module that imports what its layer may not reach. Each import is
    downward, so only the transitive check sees it."""
    package, first, second, target = PLANTS[case]
    probe, core = ROOT / package / "_probe.py", ROOT / "_probe_core.py"
    planted = {probe: first, core: second}
    monkeypatch.setattr(Path, "read_text",
                        lambda self, *a, **k: planted[self] if self in planted else Path.read_bytes(self).decode())
    monkeypatch.setitem(BY_NAME, f"trajtune.{package}._probe", probe)
    monkeypatch.setitem(BY_NAME, "trajtune._probe_core", core)
    monkeypatch.setitem(RANK, "_probe_core", 0)
    reach.cache_clear()
    try:
        test_no_module_imports_one_above_it(probe)  # every direct import is allowed
        with pytest.raises(AssertionError, match=rf"reaches \[.*'{target}'"):
            test_no_module_reaches_what_its_layer_may_not_through_other_modules(probe)
    finally:
        reach.cache_clear()


# --- experiments do not lean on each other -------------------------------------------------------------
SHARED = {
    "base": "the experiment contract (Experiment, Call, over_seeds)",
    "shared": "what chapter13, graders and rlhf_book share (the instruct policy, the calculator, their runner)",
    "hf": "the Hugging Face toolkit: model, sampling, data preparation, the hf_* loops (hf_pipeline, smollm2, hf_gym)",
    "bugfix": "the BugFix gym's policy, corpus and agent loop (agent, iw_sft_bugfix)",
    "task_rl": "RL of a tiny policy on a task gym and its report (textarena, reasoning_gym, hf_gym)",
}
"""the declared shared modules of `trajtune/experiments/`: an experiment imports its own package, these and the
library, never another experiment's internals"""
KNOWN: set[tuple[str, str]] = set()
"""imports of another experiment still to remove (none: the list is exact, so a new one fails)"""


def experiment_of(module: str) -> str | None:
    """trajtune.experiments.graders.judges -> 'graders'; the registry (trajtune.experiments) -> None."""
    parts = local(module).split(".")
    return parts[1] if parts[0] == "experiments" and len(parts) > 1 else None


def cross_imports(path: Path) -> set[tuple[str, str]]:
    me = experiment_of(module_name(path))
    if me is None or me in SHARED:
        return set()
    return {(me, other) for other in map(experiment_of, imports(path)) if other not in (None, me, *SHARED)}


@pytest.mark.parametrize("path", [p for p in MODULES if experiment_of(module_name(p))], ids=lambda p: module_name(p))
def test_no_experiment_imports_another_experiments_internals(path):
    found = cross_imports(path) - KNOWN
    assert not found, (f"{module_name(path)} imports another experiment: {sorted(found)}; move what they share into "
                       f"a declared shared module ({', '.join(SHARED)}) or the library")


def test_the_known_cross_imports_are_exact():
    assert set().union(*map(cross_imports, MODULES)) == KNOWN, "update KNOWN: an import it lists is gone"


def test_the_check_catches_an_experiment_importing_another(monkeypatch):
    fake = ROOT / "experiments" / "graders" / "_probe.py"
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: "from ..chapter13.report import x\n"
                        if self == fake else Path.read_bytes(self).decode())
    with pytest.raises(AssertionError, match="imports another experiment"):
        test_no_experiment_imports_another_experiments_internals(fake)
