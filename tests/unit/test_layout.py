"""The package's floors (ARCHITECTURE.md): no import runs back up, and the pure floors
spawn nothing and need no Ray. Read from every module's source, lazy imports included."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import eray_provider

PKG = Path(eray_provider.__file__).parent
FLOORS = {"slurm": 0, "plan": 1, "runtime": 2, "autoscaler": 3, "jax": 3}
TOP = 4  # eray_provider/__init__.py and cli.py
#: the one client of SLURM's commands: the only modules of a pure floor that run processes
SLURM_CLIENT = {"eray_provider.slurm.client", "eray_provider.slurm.srun", "eray_provider.slurm.host_commands"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Absolute names of every module ``path`` imports, at the top or inside a function."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{alias.name}" for alias in node.names)  # from . import x
    return out


def code_strings(path: Path) -> list[str]:
    """The string literals of a module, f-strings' literal parts included, docstrings not."""
    tree = ast.parse(path.read_text())
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
    ]


def floor(module: str) -> int | None:
    """The floor of a module of the package; None for others and for the package itself,
    whose light ``__init__`` every import of a submodule runs anyway."""
    parts = module.split(".")
    if parts[0] != "eray_provider" or len(parts) == 1:
        return None
    if parts[1] == "cli":
        return TOP
    if parts[1] == "errors":
        return -1  # the one family of errors, below every floor
    if parts[1] == "jax_hook":
        return FLOORS["jax"]  # the hook's old path, kept for clusters that name it
    return FLOORS.get(parts[1])


def modules_paths() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)


def lines_matching(pattern: re.Pattern[str], but: str) -> list[str]:
    """``module:line: text`` of every line of the package ``pattern`` finds, but in the
    module file named ``but`` (the one that owns what the pattern looks for)."""
    return [
        f"{module_name(p)}:{n}: {line.strip()}"
        for p in modules_paths()
        if p.name != but
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]


def test_every_module_sits_on_a_floor() -> None:
    assert {p.parent.name for p in modules_paths() if p.parent != PKG} == set(FLOORS)
    assert {p.name for p in modules_paths() if p.parent == PKG} == {
        "__init__.py",
        "cli.py",
        "errors.py",
        "jax_hook.py",
    }


def test_no_import_runs_back_up() -> None:
    wrong = []
    for path in modules_paths():
        name = module_name(path)
        here = TOP if name == "eray_provider" else floor(name)
        assert here is not None, name
        for target in imports(path):
            there = floor(target)
            if there is not None and there > here:
                wrong.append(f"{module_name(path)} -> {target}")
    assert not wrong, "imports that run up a floor:\n" + "\n".join(sorted(wrong))


def test_the_pure_floors_run_nothing_and_need_no_ray() -> None:
    wrong = []
    for path in modules_paths():
        name = module_name(path)
        if floor(name) not in (0, 1):
            continue
        for target in imports(path):
            top = target.split(".")[0]
            if top == "ray" or (top == "subprocess" and name not in SLURM_CLIENT):
                wrong.append(f"{name} -> {target}")
    assert not wrong, "\n".join(sorted(wrong))


def test_every_module_named_as_a_string_is_there() -> None:
    import importlib

    from eray_provider.plan import modules

    for name in modules.RUN_AS_PROCESS:
        assert importlib.util.find_spec(name) is not None, name
        assert "__main__" in (PKG.parent / (name.replace(".", "/") + ".py")).read_text(), name
    old = ("eray_provider.jax_hook.runtime_env_hook", "eray_provider.jax_hook.setup_worker")
    for path in (modules.RUNTIME_ENV_HOOK, modules.WORKER_SETUP_HOOK, *old):
        module, _, function = path.rpartition(".")
        assert callable(getattr(importlib.import_module(module), function)), path
    for attribute, module in modules.LAZY.items():
        assert getattr(importlib.import_module(module), attribute) is getattr(eray_provider, attribute)
    # every string in the package's code (docstrings aside) that names one of its modules
    # comes from plan/modules.py
    named = re.compile(r"eray_provider\.[a-z_]+\.[a-z_.]+|-m eray_provider\.")
    elsewhere = [
        f"{module_name(p)}: {m.group()}"
        for p in modules_paths()
        if p.name != "modules.py"
        for text in code_strings(p)
        for m in named.finditer(text)
    ]
    assert not elsewhere, elsewhere


def test_every_error_of_the_package_is_an_eray_error() -> None:
    import importlib
    import inspect

    from eray_provider.errors import ErayError

    classes = []
    for path in modules_paths():
        name = module_name(path)
        module = importlib.import_module(name)
        for obj in vars(module).values():
            if inspect.isclass(obj) and issubclass(obj, Exception) and obj.__module__ == name:
                classes.append(obj)
    private = {c for c in classes if c.__name__.startswith("_")}
    assert len(classes) - len(private) >= 20
    assert [c.__qualname__ for c in classes if c not in private and not issubclass(c, ErayError)] == []


def test_the_command_line_prints_a_cluster_error_as_one_line(monkeypatch, capsys) -> None:
    from eray_provider import cli
    from eray_provider.slurm.client import SlurmCommandError

    def fail(args):
        raise SlurmCommandError("squeue did not answer within 30 s")

    monkeypatch.setattr(cli, "_cmd_status", fail)
    assert cli.main(["status"]) == 1
    assert capsys.readouterr().err == "eray-provider: error: squeue did not answer within 30 s\n"


def test_only_the_slurm_floor_reads_slurm_variables() -> None:
    """``SLURM_*`` named as a variable (a whole string) only under slurm/ and in the hiding
    of them from Ray (plan/environment.py)."""
    named = re.compile(r"[\"'](SLURMD?_[A-Z_]+)[\"']")
    outside = [
        f"{module_name(p)}: {m.group(1)}"
        for p in modules_paths()
        if floor(module_name(p)) != 0 and p.name != "environment.py"
        for m in named.finditer(p.read_text())
    ]
    assert not outside, outside


def test_only_the_config_module_reads_the_provider_section_by_key() -> None:
    """A provider key read by string (``provider.get("drain_before_end_s", 300)``) outside
    ``plan/provider_config.py`` would apply a default of its own: every reader takes the
    typed ``ProviderConfig`` or ``Filled`` instead."""
    by_key = re.compile(r"provider\w*(?:\.get\(|\[|\.pop\()[\"']|\[[\"']provider[\"']\](?:\.get\(|\[)[\"']")
    outside = lines_matching(by_key, but="provider_config.py")
    assert not outside, outside


def test_marker_kinds_are_named_only_by_their_enum() -> None:
    """A node's marker files (``<node id>.exit``...) are named by ``plan.markers.Marker``
    alone: no module spells a kind as a string (``f"{i}.exit"``, ``read_marker(i, "ip")``,
    ``name.endswith(".drain")``)."""
    from eray_provider.plan.markers import Marker

    kinds = "|".join(m.value for m in Marker)
    spelled = re.compile(rf"_marker\([^)]*[\"']({kinds})[\"']|[\"'][^\"'\s]*\.({kinds})[\"']")
    outside = lines_matching(spelled, but="markers.py")
    assert not outside, outside


def test_no_module_imports_itself_through_others() -> None:
    """No circle of imports (at the top or inside a function) among the package's modules
    below the package itself: each module can be read before the ones that use it."""
    names = {module_name(p): p for p in modules_paths()}
    graph = {
        name: {m for m in imports(path) if m in names and m != name and floor(m) is not None}
        for name, path in names.items()
        if floor(name) is not None
    }
    circles = []
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                circles.append(" -> ".join([*path[path.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not circles, circles


def test_the_tests_are_where_their_kind_says() -> None:
    """``tests/unit`` holds what runs without a cluster, ``tests/live`` what needs the test
    bed or a Ray cluster (marked ``slurm`` or ``ray``): a newcomer's ``pytest tests/unit``
    is the per-change loop, and the markers that ``make unit`` and ``scripts/compat``
    select by say the same thing."""
    import subprocess
    import sys

    from testbed_support import REPO

    def collected(where: str, marks: str) -> int:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "--collect-only",
                "-q",
                "-p",
                "no:cacheprovider",
                "-m",
                marks,
                where,
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode in (0, 5), proc.stdout + proc.stderr  # 5: nothing collected
        return sum("::" in line for line in proc.stdout.splitlines())

    assert collected("tests/unit", "slurm or ray or soak") == 0
    assert collected("tests/live", "not slurm and not ray") == 0
    assert collected("tests/unit", "not slurm and not ray") > 400


def test_every_live_module_runs_in_exactly_one_lane() -> None:
    """``make test`` runs the live modules in the lanes of ``tests/support/lanes.py``
    (``scripts/live-lanes``): a module in no lane would never run there, one in two lanes
    twice, at once, on two beds."""
    from lanes import LANES
    from testbed_support import REPO

    live = sorted(path.stem for path in (REPO / "tests" / "live").glob("test_*.py"))
    placed = [module for lane in LANES for module in lane]
    assert sorted(placed) == live, (sorted(set(live) - set(placed)), sorted(set(placed) - set(live)))
