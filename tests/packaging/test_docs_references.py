"""What README.md and docs/*.md name exists: modules, asset keys, commands, settings, links; the README's graph is
the pipeline's.

A reference is checked when it can be recognised without guessing:

- a path that starts at one of the repository's top-level folders (``eagle_assets/generation/plan.py``,
  ``benchmarks/soak.py``, ``deploy/k8s/``; ``<placeholders>`` and ``*`` match anything): the file or folder exists.
  A bare file name (``layers.py``) is not checked: upstream sources (SGLang's, vLLM's) are named that way too, so
  name this project's modules by their path;
- a dotted name that starts at one of the repository's packages (``eagle_assets.generation.plan``, also after
  ``python -m`` or ``dagster … -m``): the longest prefix that is a module exists, and what follows it (a function,
  a class) is a word of that module's source;
- a command: ``python -m X`` (ours, or one of ``EXTERNAL_MODULES``), ``scripts/*.sh``, ``benchmarks/*.py`` (paths,
  above), and every ``--flag`` given to one of ours appears in the repository's sources;
- an asset key: a node of the Mermaid diagram, a cell of a table's ``asset`` column, a ``--select`` target
  (``group:NAME`` names a group), a ``generated/…`` or ``tokenized/…`` key, or a name written as "`name` asset" or
  "asset `name`": a key of the loaded definitions (``<placeholders>``, ``*``, ``$d`` and ``B1…B8`` stand for a
  dataset);
- an ``EAGLE_FORGE_*`` setting: a field of the settings model (``eagle_assets.settings.Settings``, its prefix and
  the field's name), or named in the product's source (``eagle_assets/``, ``resources/``, ``sensors/``), or, for
  the test harness's own switches, in ``scripts/``, ``.ci/`` or ``tests/`` (this file aside);
- a relative link: its file exists, and its ``#anchor`` is a heading of that file.

``check_markdown`` returns one line per broken reference, naming it; the tests below run it on the project's pages
and on a synthetic text whose references were renamed, which it must reject.
"""

import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from eagle_assets import keys

ROOT = Path(__file__).resolve().parents[2]
THIS = Path(__file__).resolve()
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PACKAGES = ("eagle_assets", "resources", "sensors", "tests", "benchmarks", "scripts")
PRODUCT = ("eagle_assets", "resources", "sensors")
HARNESS = ("scripts", ".ci", "tests")
# Modules of other projects the pages tell the reader to run (``python -m X``).
EXTERNAL_MODULES = {"sglang.launch_server", "pytest", "pip"}
README_LINES = 250
FILE_SUFFIXES = {"py", "sh", "md", "yaml", "yml", "json", "jsonl", "toml", "txt", "parquet"}
# The README's two commands: .ci/run runs "the README's test command", so they are kept verbatim.
TWO_COMMANDS = ("bash scripts/demo.sh", "bash scripts/test.sh")


# --- the repository as the pages may name it ---------------------------------------------------------------------


@cache
def top_level_folders() -> tuple[str, ...]:
    return tuple(
        sorted(p.name for p in ROOT.iterdir() if p.is_dir() and (p.name == ".ci" or not p.name.startswith(".")))
    )


@cache
def sources(folders: tuple[str, ...]) -> str:
    """Every .py, .sh, .yaml and extension-less script under those folders, as one text."""
    texts = []
    for folder in folders:
        base = ROOT / folder
        for path in sorted(base.rglob("*")) if base.is_dir() else []:
            wanted = path.suffix in (".py", ".sh", ".yaml", ".yml", "") or path.name == "run"
            if wanted and path.is_file() and path.resolve() != THIS and "__pycache__" not in path.parts:
                texts.append(path.read_text(errors="replace"))
    return "\n".join(texts)


@cache
def asset_keys() -> frozenset[str]:
    """The keys of the loaded definitions, ``generated/B1`` … as the UI writes them."""
    from eagle_assets import definitions

    graph = definitions.defs.resolve_asset_graph()
    return frozenset(k.to_user_string() for k in graph.get_all_asset_keys())


@cache
def datasets() -> frozenset[str]:
    return frozenset(k.split("/", 1)[1] for k in asset_keys() if k.startswith(keys.GENERATED_PREFIX + "/"))


def groups() -> set[str]:
    return {v for n, v in vars(keys).items() if n.endswith("_GROUP") and isinstance(v, str)}


def prefixes() -> set[str]:
    return {v for n, v in vars(keys).items() if n.endswith("_PREFIX") and isinstance(v, str)}


# --- the markdown ----------------------------------------------------------------------------------------------


MERMAID = re.compile(r"^```mermaid\n(.*?)^```", re.S | re.M)
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
SPAN = re.compile(r"`([^`\n]+)`")
PLACEHOLDER = re.compile(r"<[^<>/]*>|\{[^{}/]*\}|\$\w+|\*")
SETTING = re.compile(r"\bEAGLE_FORGE_[A-Z0-9_]*[A-Z0-9]")
LINK = re.compile(r"\]\(([^()\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*$", re.M)


def without_mermaid(text: str) -> str:
    return MERMAID.sub("", text)


def code_lines(text: str) -> Iterator[str]:
    """Inline code spans, and the logical lines of fenced blocks (continuations joined, comments dropped)."""
    text = without_mermaid(text)
    for block in FENCE.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0] if not line.lstrip().startswith("#") else ""
            if line.strip():
                yield line
    yield from SPAN.findall(FENCE.sub("", text))


def path_problems(text: str) -> Iterator[str]:
    tops = "|".join(re.escape(t) for t in top_level_folders())
    pattern = re.compile(rf"(?<![\w./@:-])((?:{tops})/[\w./<>{{}}$*…-]*)")
    for found in sorted(set(pattern.findall(without_mermaid(text)))):
        ref = found.rstrip(".,:;…")
        if any(ch in ref for ch in "<{$*"):
            glob = PLACEHOLDER.sub("*", ref).rstrip("/")
            if not any(ROOT.glob(glob)):
                yield f"path `{ref}`: nothing matches {glob}"
        elif not (ROOT / ref).exists():
            yield f"path `{ref}`: no such file or folder"


def module_path(dotted: str) -> Path | None:
    base = ROOT.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py", base):
        if candidate.exists() and (candidate.suffix == ".py" or candidate.is_dir()):
            return candidate
    return None


def dotted_problem(ref: str) -> str | None:
    parts = ref.split(".")
    for cut in range(len(parts), 0, -1):
        found = module_path(".".join(parts[:cut]))
        if found is None:
            continue
        if cut == len(parts):
            return None
        if found.is_dir():
            return f"module `{ref}`: no module {'.'.join(parts[: cut + 1])}"
        if not re.search(rf"\b{re.escape(parts[cut])}\b", found.read_text()):
            return f"module `{ref}`: {found.relative_to(ROOT)} does not name {parts[cut]}"
        return None
    return f"module `{ref}`: no such module"


def module_problems(text: str) -> Iterator[str]:
    pattern = re.compile(rf"(?<![\w./@:-])((?:{'|'.join(PACKAGES)})(?:\.\w+)+)")
    for ref in sorted(set(pattern.findall(without_mermaid(text)))):
        if ref.rsplit(".", 1)[1] in FILE_SUFFIXES:
            continue  # a file name (`benchmarks.md`), not a module
        if problem := dotted_problem(ref):
            yield problem


COMMAND_MODULE = re.compile(r"\b(?:python3?|dagster\b[^`|]*?)\s+-m\s+([\w.]+)")
OURS = re.compile(
    rf"(?:\bpython3?\s+-m\s+(?:{'|'.join(PACKAGES)})\b|\b(?:bash\s+|python3?\s+)?(?:scripts|benchmarks)/)"
)
FLAG = re.compile(r"(?<![\w-])(--[a-z][\w-]*)")


def command_problems(text: str) -> Iterator[str]:
    for line in code_lines(text):
        for module in COMMAND_MODULE.findall(line):
            if module.split(".")[0] in PACKAGES:
                if module_path(module) is None:
                    yield f"command `{line.strip()}`: no module {module}"
            elif module not in EXTERNAL_MODULES:
                yield f"command `{line.strip()}`: {module} is neither this project's nor a known tool"
        if OURS.search(line) and not re.search(r"\b(dagster|sglang|vllm)\b", line.split("|")[0]):
            for flag in FLAG.findall(line):
                if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", sources(PACKAGES)):
                    yield f"command `{line.strip()}`: the flag {flag} is read nowhere"


def key_problem(ref: str, where: str) -> str | None:
    ref = ref.strip().strip("'\"")
    if ref.startswith("group:"):
        return None if ref[len("group:") :] in groups() else f"{where} `{ref}`: no such group"
    if "/" in ref:
        prefix, name = ref.split("/", 1)
        if prefix not in prefixes():
            return f"{where} `{ref}`: no asset key starts {prefix}/"
        if PLACEHOLDER.fullmatch(name) or name in ("B1…B8", "B1 … B8") or name in datasets():
            return None
        return f"{where} `{ref}`: no dataset {name}"
    return None if ref in asset_keys() else f"{where} `{ref}`: no such asset key"


def table_asset_cells(text: str) -> Iterator[str]:
    lines = without_mermaid(text).splitlines()
    for i, line in enumerate(lines):
        if not (line.startswith("|") and i + 1 < len(lines) and re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", lines[i + 1])):
            continue
        header = [c.strip().lower() for c in line.strip("|").split("|")]
        columns = [n for n, c in enumerate(header) if c in ("asset", "assets", "asset key")]
        for row in lines[i + 2 :]:
            if not row.startswith("|"):
                break
            cells = re.split(r"(?<!\\)\|", row.strip().strip("|"))
            for n in columns:
                if n < len(cells):
                    yield from SPAN.findall(cells[n])


KEYISH = re.compile(r"`((?:generated|tokenized)/[^`/\s]+)`")
NAMED_ASSET = re.compile(r"`([\w/]+)` asset\b|\basset `([\w/]+)`")
SELECT = re.compile(r"--select\s+('[^']+'|\"[^\"]+\"|\S+)")


def key_problems(text: str) -> Iterator[str]:
    body = without_mermaid(text)
    refs: set[tuple[str, str]] = {("asset", r) for r in table_asset_cells(text)}
    refs |= {("asset", r) for r in KEYISH.findall(body) if "." not in r}
    refs |= {("asset", a or b) for a, b in NAMED_ASSET.findall(body)}
    for line in code_lines(text):
        for target in SELECT.findall(line):
            refs |= {("--select", part) for part in target.strip("'\"").split(",")}
    for where, ref in sorted(refs):
        if problem := key_problem(ref, where):
            yield problem


@cache
def model_settings() -> frozenset[str]:
    """The variables of the settings model (``eagle_assets.settings.Settings``: prefix + field name), if it has one."""
    from eagle_assets import settings

    model, prefix = getattr(settings, "Settings", None), getattr(settings, "PREFIX", None)
    fields = getattr(model, "model_fields", {}) if isinstance(prefix, str) else {}
    return frozenset(f"{prefix}{name}".upper() for name in fields)


def setting_problems(text: str) -> Iterator[str]:
    for name in sorted(set(SETTING.findall(text))):
        pattern = re.compile(rf"\b{name}\b")
        if name in model_settings():
            continue
        if not (pattern.search(sources(PRODUCT)) or pattern.search(sources(HARNESS))):
            yield f"setting {name}: read nowhere in {', '.join(PRODUCT + HARNESS)}"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def link_problems(text: str, page: Path) -> Iterator[str]:
    for target in sorted(set(LINK.findall(without_mermaid(text)))):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            yield f"link ({target}): no such file"
        elif anchor and dest.suffix == ".md" and anchor not in {slug(h) for h in HEADING.findall(dest.read_text())}:
            yield f"link ({target}): no heading #{anchor} in {dest.name}"


def check_markdown(text: str, page: Path = ROOT / "README.md") -> list[str]:
    return [
        *path_problems(text),
        *module_problems(text),
        *command_problems(text),
        *key_problems(text),
        *setting_problems(text),
        *link_problems(text, page),
    ]


# --- the README's graph ----------------------------------------------------------------------------------------


NODE = re.compile(r"\b(\w+)\s*[\[({]+\"?([^\"\])}]+)\"?[\])}]+")
EDGE = re.compile(r"\b(\w+)\b(?:\s*[\[({]+[^\])}]*[\])}]+)?\s*-+\.?-*>\s*(?:\|[^|]*\|\s*)?(\w+)\b")


def mermaid_graph(text: str) -> tuple[dict[str, str], set[tuple[str, str]]]:
    """The first Mermaid block's nodes (id → label) and edges (label → label)."""
    blocks = MERMAID.findall(text)
    assert blocks, "the README draws the asset graph in a ```mermaid block"
    lines = [ln.strip() for ln in blocks[0].splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith(("%%", "subgraph", "end", "flowchart", "graph", "class"))]
    nodes = {node_id: label.strip() for ln in lines for node_id, label in NODE.findall(ln)}
    edges = set()
    for ln in lines:
        for a, b in EDGE.findall(ln):
            assert a in nodes and b in nodes, f"an edge between undeclared nodes: {ln}"
            edges.add((nodes[a], nodes[b]))
    return nodes, edges


def diagram_name(key: str) -> str:
    """``generated/B1`` → ``generated/*``: the diagram draws one node for a per-dataset family."""
    prefix = key.split("/", 1)[0]
    return f"{prefix}/*" if "/" in key and prefix in prefixes() else key


def keys_module_names() -> set[str]:
    singles = {v.to_user_string() for v in vars(keys).values() if isinstance(v, keys.dg.AssetKey)}
    return singles | {f"{p}/*" for p in prefixes()}


# --- tests -----------------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _home(tmp_path_factory, monkeypatch):
    # loading the definitions writes the bundled samples under the home
    monkeypatch.setenv("EAGLE_FORGE_HOME", str(tmp_path_factory.getbasetemp() / "docs-home"))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_reference_on_the_page_exists(page):
    assert check_markdown(page.read_text(), page) == []


def test_the_readme_is_short_and_keeps_its_two_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= README_LINES
    blocks = "\n".join(FENCE.findall(text))
    for command in TWO_COMMANDS:
        assert re.search(rf"^{re.escape(command)}$", blocks, re.M), f"the README's code no longer runs `{command}`"


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in LINK.findall((ROOT / "README.md").read_text())}
    assert [p.name for p in PAGES[1:] if p.resolve() not in linked] == []


def test_the_readme_graph_draws_every_key_of_keys_py_and_the_definitions_lineage():
    nodes, edges = mermaid_graph((ROOT / "README.md").read_text())
    assert sorted(set(nodes.values())) == sorted(keys_module_names()), "the diagram's nodes are keys.py's keys"
    from eagle_assets import definitions

    graph = definitions.defs.resolve_asset_graph()
    lineage = {
        (diagram_name(parent.to_user_string()), diagram_name(key.to_user_string()))
        for key in graph.get_all_asset_keys()
        for parent in graph.get(key).parent_keys
    }
    assert sorted(edges) == sorted(lineage), "the diagram's arrows are the definitions' dependencies"


SYNTHETIC = """\
# A page

The plan is in `eagle_assets/generation/plann.py` and `eagle_assets.generation.plann`; the ledger's
`eagle_assets.generation.ledger.no_such_function`. Run `python -m eagle_assets.demoo`, `bash scripts/demoo.sh`
or `python benchmarks/soak.py --no-such-flag`, set `EAGLE_FORGE_NO_SUCH_SETTING`, materialize the
`draft_modell` asset, `generated/B9` and `tokenized/<dataset>`, and read [the tokens](docs/tokenz.md) and
[budget](#no-heading).

```bash
dagster asset materialize -m eagle_assets.definitions --select 'group:hidden_statez'
```

| group | asset |
|---|---|
| draft | `draft_benchmarkk` |
"""


def test_the_checker_names_each_broken_reference():
    problems = "\n".join(check_markdown(SYNTHETIC))
    for named in (
        "path `eagle_assets/generation/plann.py`",
        "module `eagle_assets.generation.plann`",
        "module `eagle_assets.generation.ledger.no_such_function`",
        "no module eagle_assets.demoo",
        "path `scripts/demoo.sh`",
        "the flag --no-such-flag",
        "setting EAGLE_FORGE_NO_SUCH_SETTING",
        "asset `draft_modell`",
        "asset `generated/B9`: no dataset B9",
        "--select `group:hidden_statez`: no such group",
        "asset `draft_benchmarkk`",
        "link (docs/tokenz.md)",
        "link (#no-heading)",
    ):
        assert named in problems, f"{named!r} not reported in:\n{problems}"
    assert "tokenized/<dataset>" not in problems and "benchmarks/soak.py`" not in problems


def test_a_renamed_module_fails_the_page_that_names_it():
    readme = (ROOT / "README.md").read_text()
    named = sorted(set(re.findall(r"eagle_assets/[\w/]+\.py", readme)))
    assert named, "the README names modules by path"
    renamed = readme.replace(named[0], named[0].replace(".py", "_renamed.py"))
    assert f"path `{named[0].replace('.py', '_renamed.py')}`: no such file or folder" in check_markdown(renamed)


def test_the_layout_page_names_every_product_module():
    """docs/layout.md is the map a newcomer walks with: a module it does not name is a room without a door."""
    layout = (ROOT / "docs" / "layout.md").read_text()
    modules = [
        path.relative_to(ROOT).as_posix()
        for folder in ("eagle_assets", "resources", "sensors")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path.name != "__init__.py"
    ]
    assert len(modules) > 100  # not vacuous: the product's modules were found
    missing = [m for m in modules if f"`{m}`" not in layout]
    assert missing == [], f"add a line for each to docs/layout.md: {missing}"
