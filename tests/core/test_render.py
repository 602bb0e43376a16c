"""Rendering a row's rollout Job as agent-lightning's controller does, and judging rows by it."""

import json

import jinja2
import pytest
import yaml

from image_preflight.api import filter_rows
from image_preflight.core.decide.inventory import Inventory, NodeImages
from image_preflight.core.rows.judge import INVALID, KEPT, MISSING_IMAGE, UNRENDERABLE, RowJudge, make_template
from image_preflight.core.rows.render import JobTemplate, RowError, TemplateError, yaml_escape
from tests.builders.rows import SWE_TEMPLATE, controller_render, job_template

NESTED_TEMPLATE = job_template("{{ input.extra_info.sandbox_overrides.docker_image | yaml_escape }}")


def image_of(job_object: dict) -> str:
    return job_object["spec"]["template"]["spec"]["containers"][0]["image"]


def inventory(*images: str, node: str = "node-1") -> Inventory:
    return Inventory((NodeImages.from_names(node, images),))


# --- rendering ------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["plain", 'quo"te', "back\\slash", "colon: yes", "ünï", 7, None, True])
def test_yaml_escape_is_json_dumps_of_str(value):
    assert yaml_escape(value) == json.dumps(str(value), ensure_ascii=True)
    assert yaml.safe_load(yaml_escape(value)) == str(value)


@pytest.mark.parametrize(
    "row",
    [
        {"image_name": "swesmith.x86_64.owner__repo.abcd1234", "instance_id": "x"},
        {"image_name": "swebench/sweb.eval.x86_64.django__django-1", "extra": [1, 2]},
    ],
)
def test_render_matches_the_controller_for_a_complete_row(row):
    assert JobTemplate(SWE_TEMPLATE).render(row)["spec"] == controller_render(SWE_TEMPLATE, row)["spec"]
    assert image_of(JobTemplate(SWE_TEMPLATE).render(row)) == row["image_name"] + ":openai"


def test_row_without_the_image_field_is_refused_where_the_controller_renders_colon_openai():
    assert image_of(controller_render(SWE_TEMPLATE, {})) == ":openai"  # the silent failure
    with pytest.raises(RowError, match=r"input\.image_name"):
        JobTemplate(SWE_TEMPLATE).render({"instance_id": "x"})


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("{{ input.image_name | default('fallback:1') }}", "fallback:1"),
        ("{% if input.image_name is defined %}{{ input.image_name }}{% else %}other:2{% endif %}", "other:2"),
        ("{{ input.image_name if input.image_name is defined else 'third:3' }}", "third:3"),
        ("{{ input.image_name or 'fourth:4' }}", "fourth:4"),
    ],
)
def test_guarded_missing_field_is_not_flagged(line, expected):
    assert image_of(JobTemplate(job_template(line)).render({})) == expected


def test_missing_field_printed_through_a_filter_is_flagged():
    with pytest.raises(RowError, match=r"field input\.image_name: missing"):
        JobTemplate(job_template("{{ input.image_name | yaml_escape }}")).render({})


def test_unknown_top_level_variable_is_not_blamed_on_the_row():
    template = JobTemplate(job_template("{{ input.image_name }}:1", extra="  ttlSecondsAfterFinished: {{ ttl }}1\n"))
    rendered = template.render({"image_name": "img"})
    assert image_of(rendered) == "img:1"
    assert rendered["spec"]["ttlSecondsAfterFinished"] == 1


def test_jinja_still_marks_an_undefined_without_an_owner_as_render_relies_on():
    """scanner/render.py tells a variable the template lacks from a field a value lacks by
    Undefined._undefined_obj: Jinja's internal `missing` sentinel when there is no owner, the owner
    (None too) otherwise. A Jinja release that changes either fails here, not as a row blamed for
    the template's own variable, or a null parent's field printed unnoticed."""
    from jinja2.utils import missing

    printed: list[tuple[object, object]] = []

    class Recording(jinja2.Undefined):
        __slots__ = ()

        def __str__(self) -> str:
            printed.append((self._undefined_obj, self._undefined_name))
            return ""

    row: dict = {"a": None}
    jinja2.Environment(undefined=Recording).from_string(
        "{{ nope }}{{ input.absent }}{{ input['key'] }}{{ input.a.b }}").render(input=row)
    (variable, name), *fields = printed
    assert variable is missing and name == "nope"
    assert [(owner is row, field) for owner, field in fields[:2]] == [(True, "absent"), (True, "key")]
    assert fields[2][0] is None and fields[2][1] == "b"
    template = JobTemplate(job_template("img:1", extra="  ttl: {{ nope }}{{ input.a.b }}{{ input.note }}\n"))
    assert template.render_job(row)[1] == ("input.a.b", "input.note")


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({}, r"field input\.extra_info\.sandbox_overrides\.docker_image: missing"),
        ({"extra_info": {}}, r"field input\.extra_info\.sandbox_overrides\.docker_image: missing"),
        ({"extra_info": None},
         r"input\.extra_info\.sandbox_overrides\.docker_image: missing \(input\.extra_info is null\)"),
        ({"extra_info": {"sandbox_overrides": {}}}, r"field input\.extra_info\.sandbox_overrides\.docker_image"),
        ({"extra_info": {"sandbox_overrides": None}}, r"field input\.extra_info\.sandbox_overrides\.docker_image"),
    ],
)
def test_missing_nested_field_names_the_whole_path(row, message):
    with pytest.raises(RowError, match=message):
        JobTemplate(NESTED_TEMPLATE).render(row)


def test_nested_field_renders():
    row = {"extra_info": {"sandbox_overrides": {"docker_image": "reg.example/a/b:v1"}}}
    assert image_of(JobTemplate(NESTED_TEMPLATE).render(row)) == "reg.example/a/b:v1"


def test_value_of_the_wrong_type_is_a_row_error_not_a_crash():
    template = JobTemplate(job_template("img:1", extra="  activeDeadlineSeconds: {{ input.minutes * 60 + 1 }}\n"))
    assert template.render({"minutes": 2})["spec"]["activeDeadlineSeconds"] == 121
    with pytest.raises(RowError, match="template error"):
        template.render({"minutes": "two"})


def test_rendered_text_that_is_not_yaml_is_a_row_error():
    template = JobTemplate(job_template("{{ input.image_name }}"))
    with pytest.raises(RowError, match="does not parse"):
        template.render({"image_name": "a: [b"})


# --- checked once up front ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (SWE_TEMPLATE + "---\n" + SWE_TEMPLATE, "2 YAML documents"),
        (SWE_TEMPLATE.replace("kind: Job", "kind: Pod"), "kind 'Pod'"),
        ("kind: Job\n{{ oops }}: [\n", "does not parse"),
    ],
)
def test_check_rejects_a_template_that_cannot_yield_one_job(source, message):
    template = JobTemplate(source, name="job.yaml")
    with pytest.raises(TemplateError, match=message) as raised:
        template.check()
    assert str(raised.value).startswith("job.yaml: ")
    assert "\n" not in str(raised.value)


def test_syntax_error_names_the_file_and_line():
    source = SWE_TEMPLATE + "  activeDeadlineSeconds: {{ input.minutes * }}\n  parallelism: 1\n"
    with pytest.raises(TemplateError) as raised:
        JobTemplate(source, name="job.yaml")
    line = SWE_TEMPLATE.count("\n") + 1
    assert str(raised.value).startswith(f"job.yaml:{line}: ")
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("statement", ['{% include "other.yaml" %}', '{% import "macros.j2" as m %}'])
def test_templates_that_load_other_templates_are_refused(statement):
    """The controller's Environment has no loader, so such a template fails for every row."""
    line = SWE_TEMPLATE.count("\n") + 1
    with pytest.raises(TemplateError, match=rf"^job\.yaml:{line}: .*loader"):
        JobTemplate(SWE_TEMPLATE + statement + "\n", name="job.yaml")


def test_unknown_filter_is_a_syntax_error():
    with pytest.raises(TemplateError, match=r"job\.yaml:\d+: .*no_such_filter"):
        JobTemplate(job_template("{{ input.image_name | no_such_filter }}"), name="job.yaml")


@pytest.mark.parametrize(
    "source",
    [
        SWE_TEMPLATE,
        NESTED_TEMPLATE,
        job_template("img:1", extra="  activeDeadlineSeconds: {{ input.minutes + 60 }}\n"),  # an int field
        job_template("{{ input.image_name.replace('__', '_1776_') }}:openai"),
        job_template("{{ input.get('image_name') }}:openai"),
    ],
)
def test_check_accepts_templates_whose_rendering_depends_on_the_row(source):
    JobTemplate(source).check()


# --- field discovery ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "paths"),
    [
        ("{{ input.a }}", (("a",),)),
        ('{{ input["a"] }}', (("a",),)),
        ("{{ input.a.b }}", (("a", "b"),)),
        ('{{ input["a"]["b"][0] }}', (("a", "b", 0),)),
        ("{{ input.b }}{{ input.a | default('x') }}", (("a",), ("b",))),
        ("{% if input.a is defined %}{{ input.c }}{% endif %}", (("a",), ("c",))),
        ("{{ input.a.lower() }}", (("a",),)),
        ("{% for k, v in input.a.items() %}{{ v }}{% endfor %}", (("a",),)),
        ('{{ input.get("a") }}', None),
        ("{{ input | tojson }}", None),
        ("{% set row = input %}{{ row.a }}", None),
        ("{{ input[job_name] }}", None),
        ("{{ job_name }}", ()),
    ],
)
def test_paths_read_by_the_template(expression, paths):
    assert JobTemplate(expression).paths == paths


def test_one_render_per_distinct_combination_of_read_values():
    images = ["img-a", "img-b", "img-c"]
    rows = [{"image_name": images[i % 3], "instance_id": f"id-{i}", "problem": "x" * (i % 7)} for i in range(1000)]
    judge = RowJudge(make_template(None, "{{ input.image_name }}:openai"), inventory("img-a:openai"))
    verdicts = [judge.judge(row) for row in rows]
    assert judge.renders == 3
    assert [v.kept for v in verdicts] == [row["image_name"] == "img-a" for row in rows]


def test_every_field_read_splits_the_cache():
    template = make_template(SWE_TEMPLATE.replace("name: {{ job_name }}", "name: {{ input.instance_id }}"), None)
    judge = RowJudge(template, inventory("img:openai"))
    for i in range(10):
        judge.judge({"image_name": "img", "instance_id": f"id-{i}"})
    assert judge.renders == 10


def test_whole_row_templates_render_each_distinct_row_once():
    judge = RowJudge(make_template(job_template("{{ input.get('image_name') }}:openai"), None), inventory("a:openai"))
    rows = [{"image_name": "a", "n": i % 4} for i in range(40)]
    assert all(judge.judge(row).kept for row in rows)
    assert judge.renders == 4


def test_method_of_a_field_renders_per_value():
    """`input.image_name.lower()` depends on the name: rows must not share one render."""
    judge = RowJudge(make_template(None, "{{ input.image_name.lower() }}:openai"), inventory("a:openai"))
    assert judge.judge({"image_name": "B"}).reason == MISSING_IMAGE
    assert judge.judge({"image_name": "A"}).reason == KEPT
    assert judge.renders == 2


def test_absent_parent_and_null_parent_are_judged_apart():
    """`input.a.b is defined` is false when `a` is null but an error when `a` is absent."""
    source = job_template("{% if input.a.b is defined %}{{ input.a.b }}{% else %}img{% endif %}:openai")
    for first, second in [({"a": None}, {}), ({}, {"a": None})]:
        judge = RowJudge(make_template(source, None), inventory("img:openai"))
        verdicts = {json.dumps(row): judge.judge(row).reason for row in (first, second)}
        assert verdicts == {json.dumps({"a": None}): KEPT, json.dumps({}): UNRENDERABLE}


def test_type_of_a_value_matters_to_the_cache():
    judge = RowJudge(make_template(None, "img:{{ input.tag }}"), inventory("img:1"))
    assert judge.judge({"tag": 1}).kept
    assert not judge.judge({"tag": 1.0}).kept  # renders "img:1.0"
    assert not judge.judge({"tag": True}).kept  # renders "img:True"


# --- verdicts through the Python API --------------------------------------------------------------


def test_filter_rows_with_a_template():
    rows = [
        {"image_name": "present"},
        {"image_name": "absent"},
        {"instance_id": "no image"},
        {"image_name": "Upper"},
    ]
    kept, dropped = filter_rows(rows, template=SWE_TEMPLATE, inventory=inventory("present:openai"))
    assert kept == [rows[0]]
    assert [(index, verdict.reason) for index, _, verdict in dropped] == [
        (1, MISSING_IMAGE),
        (2, UNRENDERABLE),
        (3, INVALID),
    ]
    assert dropped[0][2].images == ("absent:openai",)
    assert dropped[0][2].nodes == ("node-1",)
    assert "input.image_name" in dropped[1][2].detail
    assert dropped[2][2].images == ("Upper:openai",)
    assert all(dropped_row is rows[index] for index, dropped_row, _ in dropped)


def test_filter_rows_image_shortcut_works_like_the_template():
    rows = [{"image_name": name} for name in ("present", "absent", "Upper")] + [{}]
    by_template = filter_rows(rows, template=SWE_TEMPLATE, inventory=inventory("present:openai"))
    by_image = filter_rows(rows, image="{{ input.image_name }}:openai", inventory=inventory("present:openai"))
    assert by_image[0] == by_template[0] == [rows[0]]
    assert [(i, v.reason, v.images) for i, _, v in by_image[1]] == [
        (i, v.reason, v.images) for i, _, v in by_template[1]
    ]


def test_filter_rows_needs_exactly_one_of_template_and_image():
    with pytest.raises(ValueError):
        filter_rows([], inventory=inventory())
    with pytest.raises(ValueError):
        filter_rows([], template=SWE_TEMPLATE, image="x", inventory=inventory())


def test_filter_rows_rejects_a_two_document_template():
    with pytest.raises(TemplateError, match="2 YAML documents"):
        filter_rows([{"image_name": "x"}], template=SWE_TEMPLATE + "---\n" + SWE_TEMPLATE, inventory=inventory())


def test_filter_rows_accepts_any_iterable_of_rows():
    rows = ({"image_name": name} for name in ("present", "absent"))
    kept, dropped = filter_rows(rows, image="{{ input.image_name }}:openai", inventory=inventory("present:openai"))
    assert kept == [{"image_name": "present"}]
    assert [index for index, _, _ in dropped] == [1]
