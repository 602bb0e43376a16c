"""image_preflight.core.decide.references against the distribution/reference conformance data, plus the hot-path cache.

The data (tests/data/conformance/image-references.json) states what github.com/distribution/reference
gives for each input; it travels with the project so that a fresh clone runs every case.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from image_preflight.core.decide import references as images
from image_preflight.core.decide.references import InvalidReference

DATA_FILE = Path(__file__).resolve().parents[1] / "data" / "conformance" / "image-references.json"
DATA = json.loads(DATA_FILE.read_text(encoding="utf-8"))

SHA512 = "sha512 registered"  # the default, as in docker and containerd builds
SHA256_ONLY = "sha256 only"  # as the upstream tests and the oracle were built
MODES = [pytest.param(True, id=SHA512), pytest.param(False, id=SHA256_ONLY)]


def _id(text: str) -> str:
    if text == "":
        return "<empty>"
    shown = text if len(text) <= 80 else f"{text[:60]}...({len(text)} chars)"
    return shown.encode("unicode_escape").decode("ascii")


def _cases(section: str, key: str = "input") -> list:
    entries = DATA[section]
    return [pytest.param(entry, id=_id(entry[key])) for entry in entries]


# The project matches tags and image IDs by these patterns (a domain only as part of a name).
PATTERNS = {"tag": images.TAG_RE, "identifier": images.IDENTIFIER_RE}


def _component_cases() -> list:
    return [
        pytest.param(kind, entry, id=f"{kind}:{_id(entry['input'])}")
        for kind, entries in DATA["components"].items() if kind in PATTERNS
        for entry in entries
    ]


def _expected(entry: dict, allow_sha512: bool) -> dict:
    """The fields to check: `if_sha512_registered` replaces the entry (and narrows the fields)
    when sha384/sha512 are accepted."""
    override = entry.get("if_sha512_registered")
    return override if allow_sha512 and override else entry


def _check(expected: dict, got: dict) -> None:
    checked = {key: got[key] for key in got if key in expected}
    assert checked == {key: expected[key] for key in checked}


def _raises(expected: dict, call) -> None:
    with pytest.raises(InvalidReference) as info:
        call()
    assert info.value.error == expected["error"]
    if expected.get("error_message"):
        assert info.value.detail == expected["error_message"]


def test_conformance_data_present():
    assert {"parse", "normalize", "with_name", "compose", "components"} <= set(DATA)


@pytest.mark.parametrize("allow_sha512", MODES)
@pytest.mark.parametrize("entry", _cases("parse"))
def test_parse(entry, allow_sha512):
    expected = _expected(entry, allow_sha512)

    def call():
        return images.parse(entry["input"], allow_sha512=allow_sha512)

    if not expected["valid"]:
        _raises(expected, call)
        return
    ref = call()
    _check(
        expected,
        {
            "domain": ref.domain,
            "path": ref.path,
            "name": ref.name,
            "tag": ref.tag,
            "digest": ref.digest,
            "string": str(ref),
        },
    )


@pytest.mark.parametrize("allow_sha512", MODES)
@pytest.mark.parametrize("entry", _cases("normalize"))
def test_normalize(entry, allow_sha512):
    expected = _expected(entry, allow_sha512)
    ref = entry["input"]
    calls = {
        "normalized": images.normalize,
        "familiar": images.familiar,
        "docker_ref": images.docker_ref,
    }
    if not expected["valid"]:
        for name, fn in calls.items():
            _raises(expected, lambda fn=fn: fn(ref, allow_sha512=allow_sha512))
        _raises(expected, lambda: images.parse_normalized(ref, allow_sha512=allow_sha512))
        return
    parsed = images.parse_normalized(ref, allow_sha512=allow_sha512)
    got = {name: fn(ref, allow_sha512=allow_sha512) for name, fn in calls.items()}
    got.update(domain=parsed.domain, path=parsed.path, tag=parsed.tag, digest=parsed.digest)
    _check(expected, got)
    assert str(parsed) == got["normalized"]


@pytest.mark.parametrize("entry", _cases("with_name"))
def test_with_name(entry):
    if not entry["valid"]:
        _raises(entry, lambda: images.with_name(entry["input"]))
        return
    ref = images.with_name(entry["input"])
    assert (ref.domain, ref.path, ref.tag, ref.digest) == (entry["domain"], entry["path"], None, None)


@pytest.mark.parametrize("entry", _cases("compose", key="expected"))
def test_compose(entry):
    ref = images.with_name(entry["name"])
    steps = [("tag", entry["tag"]), ("digest", entry["digest"])]
    if entry["order"] == "digest-then-tag":
        steps.reverse()
    for kind, value in steps:
        if value is not None:
            ref = images.with_tag(ref, value) if kind == "tag" else images.with_digest(ref, value)
    assert str(ref) == entry["expected"]


@pytest.mark.parametrize("kind, entry", _component_cases())
def test_components(kind, entry):
    pattern = PATTERNS[kind]
    assert (pattern.fullmatch(entry["input"]) is not None) is entry["match"]


# --- hand tests: the hot-path cache and the error contract ---------------------------------

SHA512_REF = "foo@sha512:" + "f" * 128


@pytest.mark.parametrize("fn", [images.normalize, images.docker_ref, images.parse_normalized])
def test_cached_invalid_reference_raises_on_every_call(fn):
    errors = []
    for _ in range(2):
        with pytest.raises(InvalidReference) as info:
            fn("Foo/Bar:tag")
        errors.append(info.value)
    assert errors[0] is not errors[1]
    assert [e.error for e in errors] == ["ErrRemoteNameNotLowercase"] * 2
    assert fn.cache_info().hits >= 1


def test_cached_valid_reference_is_served_from_the_cache():
    ref = "registry.example:5000/team/app:v1"
    images.docker_ref.cache_clear()
    assert images.docker_ref(ref) == images.docker_ref(ref) == ref
    assert images.docker_ref.cache_info()[:2] == (1, 1)  # hits, misses


@pytest.mark.parametrize("first", [True, False], ids=["sha512-first", "sha256-only-first"])
def test_cache_keeps_digest_modes_apart(first):
    images.normalize.cache_clear()
    for allow_sha512 in (first, not first):
        if allow_sha512:
            assert images.normalize(SHA512_REF) == "docker.io/library/" + SHA512_REF
        else:
            with pytest.raises(InvalidReference) as info:
                images.normalize(SHA512_REF, allow_sha512=False)
            assert info.value.error == "digest.ErrDigestUnsupported"


def test_docker_ref_prefers_the_digest_and_defaults_the_tag():
    digest = "sha256:" + "a" * 64
    assert images.docker_ref(f"ubuntu:22.04@{digest}") == f"docker.io/library/ubuntu@{digest}"
    assert images.docker_ref("ubuntu") == "docker.io/library/ubuntu:latest"
    assert images.normalize("ubuntu") == "docker.io/library/ubuntu"


@pytest.mark.parametrize("bad", [None, 42, ["ubuntu"]], ids=["None", "int", "list"])
def test_non_string_is_an_invalid_reference(bad):
    for fn in (images.normalize, images.docker_ref, images.parse):
        with pytest.raises(InvalidReference) as info:
            fn(bad)
        assert info.value.error == "ErrReferenceInvalidFormat"


def test_error_message_is_one_line_and_names_the_input():
    with pytest.raises(InvalidReference) as info:
        images.docker_ref("foo/bar:tag\n")
    message = str(info.value)
    assert "\n" not in message
    assert repr("foo/bar:tag\n") in message
    assert info.value.ref == "foo/bar:tag\n"


def test_error_survives_pickling():
    with pytest.raises(InvalidReference) as info:
        images.normalize("UPPER")
    copy = pickle.loads(pickle.dumps(info.value))
    assert (copy.ref, copy.error, copy.detail, str(copy)) == (
        info.value.ref,
        info.value.error,
        info.value.detail,
        str(info.value),
    )
