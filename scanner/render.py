"""Render the rollout Job for a dataset row exactly as agent-lightning's controller does.

The controller uses a plain `jinja2.Environment()` with one filter, `yaml_escape`, renders with
`input` (the row) and `job_name`, and loads the text with `yaml.safe_load_all`. We render the same
way and additionally notice when an undefined value is printed (a row lacking `image_name` would
silently become ":openai" there).
"""

from __future__ import annotations

import contextvars
import json
from collections.abc import Mapping
from dataclasses import dataclass

import jinja2
import yaml
from jinja2 import nodes

JOB_NAME = "image-preflight-scan"  # job names never reach an image; one constant keeps renders cacheable
_printed_undefined: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("printed_undefined", default=None)
_DICT_METHODS = frozenset(dir(dict))


def yaml_escape(value: object) -> str:
    return json.dumps(str(value), ensure_ascii=True)


class _NoticingUndefined(jinja2.Undefined):
    """Renders as the default Undefined does (""), but records that it was printed."""

    __slots__ = ()

    def __str__(self) -> str:
        noticed = _printed_undefined.get()
        if noticed is not None:
            noticed.append(self._undefined_name or "?")
        return ""


class TemplateError(ValueError):
    """The template cannot produce a rollout Job; the message names the file and line."""


class RowError(ValueError):
    """This row cannot be rendered into a Job; the message names the field."""


@dataclass(frozen=True, slots=True)
class Rendered:
    job: dict


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(undefined=_NoticingUndefined)
    env.filters["yaml_escape"] = yaml_escape
    return env


def image_template(expression: str) -> str:
    """A one-container Job template whose image is `expression` (itself a template)."""
    return (
        "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: {{ job_name | yaml_escape }}\n"
        "spec:\n  backoffLimit: 0\n  template:\n    spec:\n      restartPolicy: Never\n"
        "      containers:\n      - name: rollout\n"
        "{% set image %}" + expression + "{% endset %}"
        "        image: {{ image | yaml_escape }}\n        imagePullPolicy: IfNotPresent\n"
    )


class JobTemplate:
    """A Job template and the row fields it reads (`paths`), so renders can be shared by rows
    that agree on those fields. `paths` is None when the template reads the row as a whole."""

    def __init__(self, source: str, *, name: str = "<template>") -> None:
        self.name = name
        env = _environment()
        try:
            tree = env.parse(source)
            self._template = env.from_string(tree)
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(f"{name}:{exc.lineno}: {exc.message}") from None
        self.paths: tuple[tuple[str | int, ...], ...] | None = input_paths(tree)

    def render(self, row: Mapping) -> dict:
        """The Job for `row`; RowError names a field the row lacks or what went wrong."""
        noticed: list[str] = []
        token = _printed_undefined.set(noticed)
        try:
            text = self._template.render(input=row, job_name=JOB_NAME)
        except jinja2.TemplateError as exc:
            raise RowError(f"template error: {exc}") from None
        except Exception as exc:  # a filter or method applied to a value of the wrong type
            raise RowError(f"template error: {type(exc).__name__}: {exc}") from None
        finally:
            _printed_undefined.reset(token)
        if noticed:
            raise RowError(f"field {self._field_path(row, noticed[0])}: missing")
        return self.load(text)

    def load(self, text: str) -> dict:
        try:
            documents = [d for d in yaml.safe_load_all(text) if d is not None]
        except yaml.YAMLError as exc:
            raise RowError(f"rendered YAML does not parse: {' '.join(str(exc).split())}") from None
        if len(documents) != 1:
            raise RowError(f"renders {len(documents)} YAML documents, not exactly one Job")
        job = documents[0]
        if not isinstance(job, dict) or job.get("kind") != "Job":
            kind = job.get("kind") if isinstance(job, dict) else type(job).__name__
            raise RowError(f"renders kind {kind!r}, not Job")
        return job

    def probe_row(self) -> dict:
        """A row holding a plausible value at every path the template reads."""
        row: dict = {}
        for path in self.paths or ():
            node = row
            for key in path[:-1]:
                node = node.setdefault(key, {}) if isinstance(node, dict) else {}
            if isinstance(node, dict) and path:
                node.setdefault(path[-1], "image-preflight-probe")
        return row

    def check(self) -> None:
        """Fail early when the template cannot render one Job even for a well-formed row."""
        try:
            self.render(self.probe_row())
        except RowError as exc:
            if str(exc).startswith("field "):
                return  # depends on row content we cannot guess; judged per row
            raise TemplateError(f"{self.name}: {exc}") from None

    def _field_path(self, row: Mapping, name: str) -> str:
        for path in self.paths or ():
            if path and path[-1] == name and lookup(row, path) is MISSING:
                return "input." + ".".join(map(str, path))
        return f"input.{name}" if self.paths is not None else name


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING = _Missing()


def lookup(row: object, path: tuple[str | int, ...]) -> object:
    node = row
    for key in path:
        if isinstance(node, Mapping):
            if key not in node:
                return MISSING
            node = node[key]
        elif isinstance(node, (list, tuple)) and isinstance(key, int) and -len(node) <= key < len(node):
            node = node[key]
        else:
            return MISSING
    return node


def input_paths(tree: nodes.Template) -> tuple[tuple[str | int, ...], ...] | None:
    """Every `input.a.b` / `input["a"][0]` chain the template reads, longest form; None when
    `input` is used in a way we cannot follow (passed whole, indexed by a variable, ...)."""
    paths: set[tuple[str | int, ...]] = set()
    parents: dict[int, nodes.Node] = {}
    for parent in tree.find_all(nodes.Node):
        for child in parent.iter_child_nodes():
            parents[id(child)] = parent
    for name in tree.find_all(nodes.Name):
        if name.name != "input" or name.ctx != "load":
            continue
        path: list[str | int] = []
        node: nodes.Node = name
        while True:
            parent = parents.get(id(node))
            key = _step(parent, node)
            if key is None:
                break
            path.append(key)
            node = parent  # type: ignore[assignment]
        if not path:
            return None  # the row itself is used: every field may matter
        paths.add(tuple(path))
    if any(n.name == "input" and n.ctx == "store" for n in tree.find_all(nodes.Name)):
        return None
    return tuple(sorted(paths, key=lambda p: tuple(map(str, p))))


def _step(parent: nodes.Node | None, child: nodes.Node) -> str | int | None:
    """The key `parent` reads from `child`, if it is a constant field access."""
    if isinstance(parent, nodes.Getattr) and parent.node is child:
        # `input.items` is dict.items to Jinja, not the field "items".
        return None if parent.attr in _DICT_METHODS else parent.attr
    if isinstance(parent, nodes.Getitem) and parent.node is child and isinstance(parent.arg, nodes.Const):
        key = parent.arg.value
        return key if isinstance(key, (str, int)) and not isinstance(key, bool) else None
    return None
