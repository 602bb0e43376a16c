"""The faces as the package finds them, the commands as the CLI loads them, the errors as it shows
them: one list of faces, no import loop, light parsers, one error base."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import inspect
import pkgutil
import re
import subprocess
import sys
import sysconfig
import tomllib
from importlib.metadata import distribution, packages_distributions
from pathlib import Path

import pytest

import image_preflight
from image_preflight.cli import COMMANDS
from image_preflight.errors import BrokenLoopError, InputError, PreflightError, UnavailableError, UsageError
from image_preflight.faces import BASE_MODULES, EXTRA_MODULES, FACES

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
# What no parser may load: the libraries each runner imports when it runs.
HEAVY = tuple(sorted({m for modules in EXTRA_MODULES.values() for m in modules} | set(BASE_MODULES)
                     - {"rich", "pytest"}))


def test_the_faces_are_pyprojects_package_dirs_and_packages():
    setuptools = PYPROJECT["tool"]["setuptools"]
    assert setuptools["package-dir"] == {f"image_preflight.{face}": face for face in FACES}
    assert {f"image_preflight.{face}" for face in FACES} <= set(setuptools["packages"])
    for face in FACES:
        assert (ROOT / face / "__init__.py").is_file(), face


def _from_a_checkout(code: str) -> subprocess.CompletedProcess:
    """`code` run from the source tree beside an installed environment, without the editable
    install's finder: as a checkout next to a normal install of the dependencies imports it."""
    prelude = f"import sys; sys.path[:0] = [{str(ROOT)!r}]; sys.path.append({sysconfig.get_paths()['purelib']!r})\n"
    return subprocess.run([sys.executable, "-S", "-c", prelude + code], capture_output=True, text=True,
                          cwd=ROOT / "tests", timeout=120)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_subcommand_runs_from_a_checkout_beside_an_install(command):
    done = _from_a_checkout(f"from image_preflight.cli import main; raise SystemExit(main([{command!r}, '--help']))")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: image-preflight {command}"), done.stdout


def test_every_face_imports_from_a_checkout_beside_an_install():
    done = _from_a_checkout(
        "import importlib\n"
        f"for face in {list(FACES)!r}: print(importlib.import_module('image_preflight.' + face).__file__)")
    assert done.returncode == 0, done.stderr
    assert [Path(line).parent for line in done.stdout.split()] == [ROOT / face for face in FACES]


def _face_sources():
    for face in FACES:
        for path in sorted((ROOT / face).glob("*.py")):
            yield face, path


def _faces_named(path: Path) -> set[str]:
    """The faces' modules `path` imports, or names whole in a string (as a lazy import does)."""
    face = re.compile(rf"image_preflight\.({'|'.join(FACES)})(\.\w+)*")
    named = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            named |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            named |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            named.add(node.value)
    return {name for name in named if face.fullmatch(name)}


def test_the_base_package_imports_no_face():
    """The core, the shells and the Python API stand below every face; only the CLI, which runs the
    chosen one, loads a face."""
    offending = {str(path.relative_to(ROOT)): sorted(named)
                 for path in sorted((ROOT / "image_preflight").rglob("*.py"))
                 if path != ROOT / "image_preflight" / "cli.py" and (named := _faces_named(path))}
    assert offending == {}


def test_no_face_imports_the_cli():
    """The CLI loads the faces; a face importing it back would be a loop."""
    offending = [f"{path.relative_to(ROOT)}" for _, path in _face_sources()
                 if re.search(r"^\s*(from|import)\s+image_preflight\.cli\b", path.read_text(), re.M)]
    assert offending == []


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_building_and_parsing_a_command_loads_no_other_face_and_no_heavy_library(command):
    argv = {
        "scan": ["scan", "d.jsonl", "--image", "x:1", "--inventory", "n.json"],
        "serve": ["serve", "--tls-cert", "c", "--tls-key", "k"],
        "certs": ["certs", "--service", "s", "--namespace", "n", "--out-dir", "o"],
        "agent": ["agent", "--print", "--node", "n"],
        "inventory": ["inventory", "dump"],
        "watchdog": ["watchdog"],
        "doctor": ["doctor"],
    }[command]
    done = subprocess.run([sys.executable, "-c", (
        "import sys\n"
        "from image_preflight.cli import build_parser\n"
        f"parser, unavailable = build_parser({command!r})\n"
        f"assert not unavailable, unavailable\n"
        f"parser.parse_args({argv!r})\n"
        "print(*sorted(sys.modules))")], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = set(done.stdout.split())
    own = COMMANDS[command].module.split(".")[1]
    # (Looking up google.protobuf imports the empty google namespace, not protobuf.)
    assert {m for m in loaded if m in HEAVY or m.startswith(tuple(f"{h}." for h in HEAVY))} == set()
    other_faces = {f for f in FACES if f != own}
    assert {m for m in loaded if m.startswith("image_preflight.") and m.split(".")[1] in other_faces} == set()


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # as the package index compares names


def _top_level(module: str) -> str:
    return module.partition(".")[0]


def _requirements(extra: str) -> set[str]:
    """The distributions an extra installs, following its image-preflight[...] references."""
    names: set[str] = set()
    for requirement in PYPROJECT["project"]["optional-dependencies"][extra]:
        name = _normal(re.match(r"[A-Za-z0-9_.-]+", requirement).group(0))
        nested = re.fullmatch(r"image-preflight\[([a-z,]+)\]", requirement.split(";")[0].strip())
        if nested:
            for inner in nested.group(1).split(","):
                names |= _requirements(inner)
        else:
            names.add(name)
    return names


def _distribution(module: str) -> str:
    """The distribution installing `module`; of a namespace package's several (opentelemetry's),
    the one whose files hold the module's folder."""
    names = packages_distributions()[_top_level(module)]
    folder = module.replace(".", "/") + "/"
    holders = [n for n in names if any(str(f).startswith(folder) for f in distribution(n).files or ())]
    return _normal((holders or names)[0])


def test_the_base_modules_are_pyprojects_dependencies():
    dependencies = {_normal(re.match(r"[A-Za-z0-9_.-]+", d).group(0)) for d in PYPROJECT["project"]["dependencies"]}
    assert {_distribution(m) for m in BASE_MODULES} == dependencies


def _with_dependencies(names: set[str]) -> set[str]:
    """`names` and what they install in turn, as the installed distributions declare it."""
    found, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        try:
            requirements = importlib.metadata.requires(name) or ()
        except importlib.metadata.PackageNotFoundError:  # for another Python (a marker): not here
            continue
        for requirement in requirements:
            if "extra ==" not in requirement:
                todo.append(_normal(re.match(r"[A-Za-z0-9_.-]+", requirement).group(0)))
    return found


@pytest.mark.parametrize("extra", sorted(EXTRA_MODULES))
def test_each_extras_modules_are_what_pyproject_installs_for_it(extra):
    """faces.EXTRA_MODULES, the one list the CLI and the tests read, against pyproject.toml."""
    modules = {_distribution(m) for m in EXTRA_MODULES[extra]}
    assert modules <= _with_dependencies(_requirements(extra)), modules - _requirements(extra)
    own = {_normal(re.match(r"[A-Za-z0-9_.-]+", r).group(0))
           for r in PYPROJECT["project"]["optional-dependencies"][extra]
           if not r.startswith("image-preflight[")}
    assert own <= modules | _with_dependencies(modules), own - modules


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_what_a_command_needs_is_what_its_extra_installs(command):
    spec = COMMANDS[command]
    if not spec.extra:
        assert spec.needs == ()
        return
    assert spec.needs and {_distribution(m) for m in spec.needs} <= _with_dependencies(_requirements(spec.extra))


def _modules():
    """Every module of the package, the faces installed into it included."""
    packages = [image_preflight, *(importlib.import_module(f"image_preflight.{face}") for face in FACES)]
    for package in packages:
        yield package
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            if not info.name.endswith(("__main__", "_pb2", "_pb2_grpc")):
                yield importlib.import_module(info.name)


def test_every_public_error_class_derives_from_preflight_error():
    errors = {f"{module.__name__}.{name}": value for module in _modules()
              for name, value in vars(module).items()
              if inspect.isclass(value) and issubclass(value, BaseException) and not name.startswith("_")
              and value.__module__ == module.__name__}
    assert {"image_preflight.errors.InputError", "image_preflight.agent.cri.CRIError",
            "image_preflight.core.decide.workloads.WorkloadError"} <= set(errors)
    assert sorted(name for name, cls in errors.items() if not issubclass(cls, PreflightError)) == []
    # Each on one branch of the tree errors.py draws: bad input (flags among it), a need unmet, or a
    # long-running loop broken.
    branches = (InputError, UnavailableError, BrokenLoopError)
    assert sorted(name for name, cls in errors.items()
                  if cls is not PreflightError and not issubclass(cls, branches)) == []
    assert issubclass(UsageError, InputError)
    assert issubclass(errors["image_preflight.agent.cri.CRIError"], UnavailableError)
