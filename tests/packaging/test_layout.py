"""The layout of tests/: builders and helpers in support modules of their own, fixtures in conftest
files, tests/plugins/ and the test modules using them; no test module, conftest or plugin imported
by a module of tests/ or benchmarks/ (the benchmarks share the support modules only), tests/core/
runnable with the base install alone, and every test on the control plane or the real node under
tests/cluster/."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

from image_preflight.faces import extra_top_levels

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
BENCHMARKS = ROOT / "benchmarks"
# What the extras bring (top-level import names); the base install has none of them.
EXTRAS = tuple(sorted(extra_top_levels() - {"pytest"}))


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """Every module a file imports, at any depth, with its line; `from a import b` counts a.b too."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def is_test_module(name: str) -> bool:
    """A test module, a conftest or a plugin: what pytest loads itself, and where fixtures are."""
    parts = name.split(".")
    return parts[0] == "tests" and (parts[1:2] == ["plugins"] or any(
        part.startswith("test_") or part == "conftest" for part in parts[1:]))


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def fixtures(path: Path) -> list[tuple[int, str]]:
    """The functions `path` decorates with pytest.fixture, with their lines."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for decorator in node.decorator_list:
                target = decorator.func if isinstance(decorator, ast.Call) else decorator
                if (isinstance(target, ast.Attribute) and target.attr == "fixture") or (
                        isinstance(target, ast.Name) and target.id == "fixture"):
                    found.append((node.lineno, node.name))
    return found


def sources() -> list[Path]:
    return sorted([*TESTS.rglob("*.py"), *BENCHMARKS.rglob("*.py")])


def test_no_module_imports_a_test_module_a_conftest_or_a_plugin():
    offenders = [f"{path.relative_to(ROOT)}:{line}: {name}"
                 for path in sources()
                 for line, name in imported_modules(path) if is_test_module(name)]
    assert offenders == [], ("builders go to tests/builders/, helpers to a support module; a fixture is asked "
                             "for by name, and what it wraps is a support module's to call:\n" + "\n".join(offenders))


def test_fixtures_live_in_test_modules_conftest_files_and_plugins():
    """So that a support module, which the benchmarks import, holds none: a benchmark calls the
    function or context manager a fixture wraps."""
    offenders = [f"{path.relative_to(ROOT)}:{line}: {name}" for path in sources()
                 if not is_test_module(module_name(path)) for line, name in fixtures(path)]
    assert offenders == [], "a fixture outside a test module, a conftest or tests/plugins/:\n" + "\n".join(offenders)


def test_conftest_loads_every_plugin():
    """A plugin it did not name would hold fixtures no test finds."""
    tree = ast.parse((TESTS / "conftest.py").read_text(encoding="utf-8"))
    (named,) = [ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                and any(isinstance(target, ast.Name) and target.id == "PLUGINS" for target in node.targets)]
    assert sorted(named) == sorted(f"tests.plugins.{path.stem}" for path in (TESTS / "plugins").glob("*.py")
                                   if path.stem != "__init__")


def test_an_import_of_a_test_module_is_found_at_any_depth(tmp_path):
    path = tmp_path / "test_x.py"
    path.write_text("import json\n\n\ndef f():\n    from tests.core.test_decision import node\n")
    assert [name for _, name in imported_modules(path) if is_test_module(name)] == [
        "tests.core.test_decision", "tests.core.test_decision.node"]
    assert is_test_module("tests.cluster.conftest") and is_test_module("tests.plugins.real_node")
    assert not is_test_module("tests.builders") and not is_test_module("tests.cluster.watchdog_process")


def test_a_fixture_is_found_however_it_is_decorated(tmp_path):
    path = tmp_path / "helpers.py"
    path.write_text(textwrap.dedent("""
        import pytest
        from pytest import fixture


        @pytest.fixture
        def a():
            pass


        @pytest.fixture(scope="module")
        def b():
            pass


        @fixture
        def c():
            pass


        def d():
            pass
    """))
    assert [name for _, name in fixtures(path)] == ["a", "b", "c"]


# Run by the child: the extras' modules cannot be imported, as in `pip install .` alone.
BASE_INSTALL = textwrap.dedent("""
    import sys

    import pytest

    EXTRAS = set(sys.argv[1].split(","))


    class BaseInstall:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in EXTRAS:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None


    sys.meta_path.insert(0, BaseInstall())
    sys.exit(pytest.main(sys.argv[2:]))
""")


def test_the_pure_core_tests_run_with_the_base_install_alone():
    done = subprocess.run(
        [sys.executable, "-c", BASE_INSTALL, ",".join(EXTRAS), "-q", "-p", "no:cacheprovider", "-x",
         "-W", "error::pytest.PytestAssertRewriteWarning", str(TESTS / "core")],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    tail = "\n".join(done.stdout.splitlines()[-30:])
    assert done.returncode == 0, f"tests/core/ needs an extra:\n{tail}\n{done.stderr[-2000:]}"
    assert " passed" in tail, tail


def test_every_test_on_the_control_plane_or_the_real_node_lives_in_tests_cluster():
    """The `cluster` marker goes on any test using a cluster fixture (tests/conftest.py); the
    folder says the same, so that a path alone tells where such a test lives."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-m", "cluster", str(TESTS)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    collected = [line.split("::")[0] for line in done.stdout.splitlines() if "::" in line]
    assert collected, done.stdout[-2000:]
    assert sorted({path for path in collected if not path.startswith("tests/cluster/")}) == []
