"""Render the rollout Job for a dataset row exactly as agent-lightning's controller does.

The controller uses a plain `jinja2.Environment()` with one filter, `yaml_escape`, renders with
`input` (the row) and `job_name`, and loads the text with `yaml.safe_load_all`. We render the same
way and additionally notice when an undefined value is printed (a row lacking `image_name` would
silently become ":openai" there).
"""

from __future__ import annotations

import contextvars
import json
import math
import re
from collections.abc import Iterator, Mapping
from typing import Any, overload

import jinja2
import yaml
from jinja2 import nodes

# Jinja's sentinel for "no value", outside its public names: an Undefined made for a variable of
# the template (`{{ nope }}`) holds it as `_undefined_obj`, one made for a field of a value holds
# that value, None included (`input.a.b` with a null `a`). Jinja's docs describe `_undefined_obj`
# and `_undefined_name` for Undefined subclasses, but give None for "no owner", which a null
# parent also is; no public name or call tells the two apart. tests/scanner/test_render.py
# (test_jinja_still_marks_an_undefined_without_an_owner_as_render_relies_on) fails if that moves.
from jinja2.utils import missing as _NO_PARENT

from image_preflight.core.decide.workloads import WorkloadError, deciding_fields, pod_spec_of
from image_preflight.core.rows.slots import Path, Slot, plan_slots
from image_preflight.errors import InputError

JOB_NAME = "image-preflight-scan"  # job names never reach an image; one constant keeps renders cacheable
_printed_undefined: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("printed_undefined", default=None)
_DICT_METHODS = frozenset(dir(dict))


@overload
def as_sent(value: Mapping[Any, Any]) -> Mapping[Any, Any]: ...
@overload
def as_sent(value: object) -> object: ...
def as_sent(value: object) -> object:
    """`value` as agent-lightning's controller receives it. The trainer enqueues each rollout with
    RolloutCreate.model_dump(mode="json") (agentlightning/verl/agl_rollout_manager.py,
    _create_rollouts), and pydantic v2 writes NaN and ±inf as null, so the template prints None
    where the dataset holds nan or inf. Returns `value` itself when nothing changes."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        items = [(k, v, as_sent(v)) for k, v in value.items()]
        return value if all(new is old for _, old, new in items) else {k: new for k, _, new in items}
    if isinstance(value, list):
        converted = [as_sent(v) for v in value]
        return value if all(new is old for new, old in zip(converted, value)) else converted
    return value


def yaml_escape(value: object) -> str:
    return json.dumps(str(value), ensure_ascii=True)


class _NoticingUndefined(jinja2.Undefined):
    """Renders as the default Undefined does (""), but records that a row field was printed; in a
    marking render it prints a marker instead, to find where the missing value lands."""

    __slots__ = ()

    def __str__(self) -> str:
        noticed = _printed_undefined.get()
        # Only a missing field of a value (input.x) speaks about the row; an unknown top-level
        # variable prints "" for every row alike.
        if noticed is not None and self._undefined_obj is not _NO_PARENT:
            noticed.append(self._undefined_name or "?")
            if _marking.get():
                return _UNDEFINED_MARKER
        return ""


_marking: contextvars.ContextVar[bool] = contextvars.ContextVar("marking", default=False)
_UNDEFINED_MARKER = "image-preflight-undefined-5d1f"


class TemplateError(InputError):
    """The template cannot produce a rollout Job; the message names the file and line."""


class RowError(InputError):
    """This row cannot be rendered into a Job; the message names the field."""


class JobShapeError(RowError):
    """The rendered text is not exactly one Job; for the probe row, a flaw of the template itself."""


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(undefined=_NoticingUndefined)
    env.filters["yaml_escape"] = yaml_escape
    return env


def image_template(expression: str) -> str:
    """A one-container Job template whose image is `expression` (itself a template).
    TemplateError names the expression: a line of the generated template would mean nothing."""
    env = _environment()
    try:
        tree = env.parse(expression)
        env.from_string(tree)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(f"--image {expression!r}: {' '.join(str(exc.message).split())}") from None
    if any(tree.find_all((nodes.Extends, nodes.Include, nodes.Import, nodes.FromImport))):
        raise TemplateError(f"--image {expression!r}: cannot load other templates (no template loader)")
    return (
        "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: {{ job_name | yaml_escape }}\n"
        "spec:\n  backoffLimit: 0\n  template:\n    spec:\n      restartPolicy: Never\n"
        "      containers:\n      - name: rollout\n"
        f"{_image_line(expression)}        imagePullPolicy: IfNotPresent\n"
    )


def _image_line(expression: str) -> str:
    # 'text{{ a }}more' as one escaped expression ("text" ~ (a) ~ "more"), so the image is a
    # slot (core.rows.slots) rendered per image rather than per row; anything fancier is captured.
    parts = re.split(r"{{(.*?)}}", expression)
    if "{%" in expression or "{#" in expression or len(parts) == 1:
        return "{% set image %}" + expression + "{% endset %}        image: {{ image | yaml_escape }}\n"
    terms = [json.dumps(p) if i % 2 == 0 else f"({p})" for i, p in enumerate(parts) if i % 2 or p]
    return "        image: {{ (" + " ~ ".join(terms) + ") | yaml_escape }}\n"


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
            raise TemplateError(f"{name}:{exc.lineno}: {' '.join(str(exc.message).split())}") from None
        for node in tree.find_all((nodes.Extends, nodes.Include, nodes.Import, nodes.FromImport)):
            # The controller's Environment has no loader: every row would fail there.
            raise TemplateError(f"{name}:{node.lineno}: cannot load other templates (no template loader)")
        self.paths: tuple[tuple[str | int, ...], ...] | None = input_paths(tree)
        self.plan = None
        if self.paths is not None:
            parents = _parents(tree)
            self.plan = plan_slots(env, tree, list(_input_chains(tree, parents)), parents)

    def render(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """The Job for `row`; RowError names a field the row lacks or what went wrong."""
        return self.render_job(row)[0]

    def render_job(self, row: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
        """(the Job for `row`, the fields it lacks that were printed as empty text).

        agent-lightning's controller prints a missing field as "" and the Job runs; that only
        matters where the pod's images, pull policies or scheduling read it. There RowError names
        the field; elsewhere (a prompt, an env value) the row is rendered as the controller does.
        """
        text, missing = self._render(self._template, row)
        job = self.load(text)
        if missing and self._reaches_decision(row):
            raise RowError(f"field {self._field_path(row, missing[0])}: missing")
        return job, tuple(self._field_path(row, name) for name in dict.fromkeys(missing))

    def render_shape(self, row: Mapping[str, Any]) -> tuple[str, list[str]]:
        """The text with every slot printing its marker (see core.rows.slots), and the missing
        fields printed outside the slots."""
        if self.plan is None:
            raise TypeError(f"{self.name}: no slots, so no shape to render")  # RowJudge asks only with slots
        return self._render(self.plan.shape, row)

    def render_slot(self, slot: Slot, row: Mapping[str, Any]) -> tuple[str, tuple[str, ...]]:
        """The text a slot's expression gives for `row`, before yaml_escape quotes it, and the
        missing fields it printed (as dotted paths)."""
        text, missing = self._render(slot.expression, row)
        return text, tuple(self._field_path(row, name) for name in dict.fromkeys(missing))

    def _reaches_decision(self, row: Mapping[str, Any]) -> bool:
        """Whether a missing printed field lands in the pod's decision fields: rendered again
        with a marker in its place. A marked text that no longer reads as a Job counts as yes."""
        token = _marking.set(True)
        try:
            text, _ = self._render(self._template, row)
        finally:
            _marking.reset(token)
        try:
            spec = pod_spec_of(self.load(text))
        except (RowError, WorkloadError):
            return True
        return _UNDEFINED_MARKER in json.dumps(deciding_fields(spec), default=str)

    def _render(self, template: jinja2.Template, row: Mapping[str, Any]) -> tuple[str, list[str]]:
        noticed: list[str] = []
        token = _printed_undefined.set(noticed)
        try:
            text = template.render(input=row, job_name=JOB_NAME)
        except jinja2.UndefinedError as exc:
            # input.a.b with `a` absent or null: Jinja fails on `.b`; name the whole field.
            raise RowError(self._missing_parent(row) or f"template error: {exc}") from None
        except jinja2.TemplateError as exc:
            raise RowError(f"template error: {exc}") from None
        except Exception as exc:  # a filter or method applied to a value of the wrong type
            raise RowError(f"template error: {type(exc).__name__}: {exc}") from None
        finally:
            _printed_undefined.reset(token)
        return text, noticed

    def load(self, text: str) -> dict[str, Any]:
        try:
            documents = _load_all(text)
        except yaml.YAMLError as exc:
            raise JobShapeError(f"rendered YAML does not parse: {' '.join(str(exc).split())}") from None
        if len(documents) != 1:
            raise JobShapeError(f"renders {len(documents)} YAML documents, not exactly one Job")
        job = documents[0]
        if not isinstance(job, dict) or job.get("kind") != "Job":
            kind = job.get("kind") if isinstance(job, dict) else type(job).__name__
            raise JobShapeError(f"renders kind {kind!r}, not Job")
        return job

    def probe_row(self) -> dict[str, Any]:
        """A row holding a plausible value at every path the template reads."""
        row: dict[str, Any] = {}
        for path in self.paths or ():
            node: dict[Any, Any] = row  # a path may index a list by number: its keys are not all text
            for key in path[:-1]:
                node = node.setdefault(key, {}) if isinstance(node, dict) else {}
            if isinstance(node, dict) and path:
                node.setdefault(path[-1], "image-preflight-probe")
        return row

    def check(self) -> None:
        """Fail early when the template cannot render one Job even for a well-formed row."""
        try:
            self.render(self.probe_row())
        except JobShapeError as exc:
            raise TemplateError(f"{self.name}: {exc}") from None
        except RowError:
            return  # a missing field or a value of the wrong type: depends on the row, judged per row

    def _field_path(self, row: Mapping[str, Any], name: str) -> str:
        for path in self.paths or ():
            if path and path[-1] == name and lookup(row, path) is MISSING:
                return _dotted(path)
        return f"input.{name}" if self.paths is not None else name

    def _missing_parent(self, row: Mapping[str, Any]) -> str | None:
        """'field input.a.b: missing' for the first read field whose parent is absent or null."""
        for path in self.paths or ():
            depth, value = reach(row, path)
            if depth < len(path) - 1 and (value is MISSING or value is None):
                null = f" ({_dotted(path[:depth])} is null)" if value is None else ""
                return f"field {_dotted(path)}: missing{null}"
        return None


def _load_all(text: str) -> list[Any]:
    """yaml.safe_load_all, as the controller calls it, without its empty documents.

    libyaml (CSafeLoader) builds the same documents eight times faster; where it objects, the
    pure-Python loader the controller uses has the last word, so errors read the same.
    """
    if _FastLoader is not None:
        try:
            return [d for d in yaml.load_all(text, Loader=_FastLoader) if d is not None]
        except yaml.YAMLError:
            pass
    return [d for d in yaml.safe_load_all(text) if d is not None]


_FastLoader = getattr(yaml, "CSafeLoader", None)


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING = _Missing()


def lookup(row: object, path: tuple[str | int, ...]) -> object:
    """The value at `path`, or MISSING."""
    depth, value = reach(row, path)
    return value if depth == len(path) else MISSING


def reach(row: object, path: tuple[str | int, ...]) -> tuple[int, object]:
    """How many keys of `path` can be followed through mappings and lists, and the value there.

    The value is MISSING when a mapping lacks the next key (or a list the index); otherwise it is
    the last value reached, whose own attributes (`str.lower`, None's) decide the rest.
    """
    node = row
    for depth, key in enumerate(path):
        if isinstance(node, Mapping):
            if key not in node:
                return depth, MISSING
            node = node[key]
        elif isinstance(node, (list, tuple)) and isinstance(key, int):
            if not -len(node) <= key < len(node):
                return depth, MISSING
            node = node[key]
        else:
            return depth, node
    return len(path), node


def _dotted(path: tuple[str | int, ...]) -> str:
    return "".join(["input", *(f".{key}" if isinstance(key, str) else f"[{key}]" for key in path)])


def _parents(tree: nodes.Template) -> dict[int, nodes.Node]:
    parents: dict[int, nodes.Node] = {}
    for parent in tree.find_all(nodes.Node):
        for child in parent.iter_child_nodes():
            parents[id(child)] = parent
    return parents


def _input_chains(tree: nodes.Template,
                  parents: dict[int, nodes.Node]) -> Iterator[tuple[Path, nodes.Node, nodes.Name]]:
    """(path, outermost node of the chain, the `input` Name) for every read of `input`; path ()
    when the row itself is used."""
    for name in tree.find_all(nodes.Name):
        if name.name != "input" or name.ctx != "load":
            continue
        path: list[str | int] = []
        node: nodes.Node = name
        while True:
            parent = parents.get(id(node))
            key = _step(parent, node)
            if parent is None or key is None:  # no parent reads no key
                break
            caller = parents.get(id(parent))
            if isinstance(caller, nodes.Call) and caller.node is parent:
                break  # `input.name.lower()`: a method of the value, not a field
            path.append(key)
            node = parent
        yield tuple(path), node, name


def input_paths(tree: nodes.Template) -> tuple[tuple[str | int, ...], ...] | None:
    """Every `input.a.b` / `input["a"][0]` chain the template reads, longest form; None when
    `input` is used in a way we cannot follow (passed whole, indexed by a variable, ...)."""
    paths: set[tuple[str | int, ...]] = set()
    for path, _, _ in _input_chains(tree, _parents(tree)):
        if not path:
            return None  # the row itself is used: every field may matter
        paths.add(path)
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
