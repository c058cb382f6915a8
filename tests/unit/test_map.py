"""The map is true (issue 40, item 9): every module is in its package's docstring and in docs/code.md, no library
file is over 500 lines, and docs/code.md's table of implementation inheritance is the inheritance the code has."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "trajtune"
CODE_MD = ROOT / "docs" / "code.md"

MAX_LINES = 500


def packages() -> list[Path]:
    return sorted(p.parent for p in PACKAGE.rglob("__init__.py"))


def members(package: Path) -> list[str]:
    """A package's modules ('name.py') and subpackages ('name/'), __init__.py and __main__.py aside."""
    mods = [p.name for p in sorted(package.glob("*.py")) if p.name not in ("__init__.py", "__main__.py")]
    return mods + [p.name + "/" for p in sorted(package.iterdir()) if (p / "__init__.py").is_file()]


def listed(name: str, text: str) -> bool:
    """`name` ('x.py' or 'x/') is in `text` as written, or as a bare word that starts a line of a listing."""
    stem = name.removesuffix(".py").removesuffix("/")
    return name in text or re.search(rf"^\s+{re.escape(stem)}\s", text, re.MULTILINE) is not None


def test_every_module_is_in_its_package_docstring():
    missing = []
    for package in packages():
        doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
        rel = package.relative_to(ROOT)
        if not doc:
            missing.append(f"{rel}/__init__.py: no docstring")
            continue
        missing += [f"{rel}/__init__.py does not list {m}" for m in members(package) if not listed(m, doc)]
    assert not missing, "\n".join(missing)


def code_md_sections() -> dict[str, str]:
    """docs/code.md's module map, by package: '' (top level), 'objectives', 'sources', ... -> its text."""
    text = CODE_MD.read_text().split("\n## Modules\n", 1)[1].split("\n## ", 1)[0]
    sections, name = {"": ""}, ""
    for line in text.splitlines():
        if m := re.match(r"^`([\w/]+)/`", line):
            name = m.group(1)
            sections.setdefault(name, "")
        sections[name] += line + "\n"
    return sections


def test_every_module_is_in_docs_code_md():
    """A line per module in its package's section; a package under `experiments/` is one line (`agent/`), its
    modules listed by its own docstring."""
    sections, missing = code_md_sections(), []
    for package in packages():
        rel = package.relative_to(PACKAGE).as_posix()
        top = "" if rel == "." else rel.split("/")[0]
        if top == "":  # the top-level modules; each package has a section of its own
            names = [m for m in members(package) if not m.endswith("/")]
            missing += [f"no section `{m}`" for m in members(package) if m.endswith("/") and m[:-1] not in sections]
        elif rel == top:
            names = members(package)
        elif top == "experiments":
            names = [rel.split("/")[1] + "/"]
        else:  # sources/rewards, envs/adapters: their modules on their line in the parent's section
            names = [rel.split("/", 1)[1] + "/"] + members(package)
        text = sections.get(top, "")
        missing += [f"{rel}: {n}" for n in names if not listed(n, text)]
    assert not missing, "docs/code.md's module map lacks:\n" + "\n".join(missing)


def test_no_library_file_over_500_lines():
    sizes = {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    over = {f: n for f, n in sizes.items() if n > MAX_LINES}
    assert not over, f"library files over {MAX_LINES} lines (split them along a seam): {over}"


EXCEPTIONS = {"Exception", "ValueError", "RuntimeError", "TypeError", "KeyError", "OSError", "FileNotFoundError",
              "LookupError"}


def implementation_inheritance() -> dict[str, set[str]]:
    """trajtune class -> the trajtune classes that derive from it (exceptions aside: they derive by design)."""
    bases: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases[node.name] = [ast.unparse(b).split(".")[-1] for b in node.bases]

    def is_protocol(name: str) -> bool:  # a Protocol extending a Protocol adds members, not behaviour
        return "Protocol" in bases.get(name, ())

    def is_exception(name: str, seen: frozenset = frozenset()) -> bool:
        return name in EXCEPTIONS or any(is_exception(b, seen | {name}) for b in bases.get(name, ())
                                         if b not in seen)

    out: dict[str, set[str]] = {}
    for name, parents in bases.items():
        for parent in parents:
            if parent in bases and not is_exception(parent) and not is_protocol(parent):
                out.setdefault(parent, set()).add(name)
    return out


def test_docs_code_md_says_which_classes_inherit():
    """The rows of code.md's 'Implementation inheritance' table (`| \\`Base\\` | module | \\`Sub\\`, ... |`) are
    exactly the code's: a base class added or gone, or a subclass, changes the page."""
    text = CODE_MD.read_text().split("### Implementation inheritance", 1)[1].split("\n#", 1)[0]
    table = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 3 and (m := re.fullmatch(r"`(\w+)`", cells[0])):
            table[m.group(1)] = set(re.findall(r"`(\w+)`", cells[2]))
    assert table == implementation_inheritance()
