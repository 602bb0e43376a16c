"""The layout of tests/: builders and helpers in modules of their own, fixtures in conftest files, no
test module imported by another, tests/core/ runnable with the base install alone, and every test
on the control plane or the real node under tests/cluster/."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

from image_preflight.faces import extra_top_levels

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
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
    parts = name.split(".")
    return parts[0] == "tests" and any(part.startswith("test_") or part == "conftest" for part in parts[1:])


def test_no_test_module_imports_another_or_a_conftest():
    offenders = [f"{path.relative_to(ROOT)}:{line}: {name}"
                 for path in sorted(TESTS.rglob("*.py"))
                 for line, name in imported_modules(path) if is_test_module(name)]
    assert offenders == [], "builders go to tests/builders/, fixtures to a conftest.py:\n" + "\n".join(offenders)


def test_an_import_of_a_test_module_is_found_at_any_depth(tmp_path):
    path = tmp_path / "test_x.py"
    path.write_text("import json\n\n\ndef f():\n    from tests.core.test_decision import node\n")
    assert [name for _, name in imported_modules(path) if is_test_module(name)] == [
        "tests.core.test_decision", "tests.core.test_decision.node"]
    assert is_test_module("tests.cluster.conftest")
    assert not is_test_module("tests.builders") and not is_test_module("tests.cluster.watchdog_process")


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
