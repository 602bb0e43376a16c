"""image_preflight.files.atomic: the one way the project writes a file."""

import os
import stat

import pytest

from image_preflight.errors import InputError
from image_preflight.files.atomic import atomic_path, umask_mode, write_all_atomic, write_atomic


@pytest.fixture
def umask():
    def set_mask(mask: int) -> None:
        os.umask(mask)

    old = os.umask(0o022)
    os.umask(old)
    yield set_mask
    os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
def test_a_new_file_gets_the_mode_an_ordinary_write_would(tmp_path, umask, mask):
    umask(mask)
    ordinary = tmp_path / "ordinary"
    ordinary.write_text("x")
    write_atomic(tmp_path / "atomic", "x")
    assert _mode(tmp_path / "atomic") == _mode(ordinary) == 0o666 & ~mask == umask_mode()


def test_an_explicit_mode_is_kept(tmp_path):
    write_atomic(tmp_path / "tls.key", b"secret", 0o600)
    assert _mode(tmp_path / "tls.key") == 0o600


def test_a_failed_write_leaves_the_old_file_and_no_temporary_file(tmp_path):
    target = tmp_path / "tls.crt"
    target.write_bytes(b"old")
    with pytest.raises(TypeError):
        write_atomic(target, object(), 0o644)  # type: ignore[arg-type]  # the wrong type is the test
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["tls.crt"]


def test_a_block_that_raises_replaces_nothing(tmp_path):
    target = tmp_path / "out.jsonl"
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        open(tmp, "w").write("partial")
        raise RuntimeError("stop")
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_place_is_one_line_naming_the_path(tmp_path):
    with pytest.raises(InputError, match=r"^.*/missing/out\.json: cannot write \(No such file or directory\)$"):
        write_atomic(tmp_path / "missing" / "out.json", "x")


def test_several_files_are_replaced_all_or_none(tmp_path):
    kept = {name: f"old {name}".encode() for name in ("key", "cert")}
    for name, data in kept.items():
        (tmp_path / name).write_bytes(data)
    with pytest.raises(InputError, match=rf"^{tmp_path}/absent/third: cannot write \(No such file or directory\)$"):
        write_all_atomic([(tmp_path / "key", b"new key", 0o600), (tmp_path / "cert", b"new cert", None),
                          (tmp_path / "absent" / "third", b"x", None)])
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == kept  # nor a temporary file left
    write_all_atomic([(tmp_path / "key", b"new key", 0o600), (tmp_path / "cert", b"new cert", None)])
    assert ((tmp_path / "key").read_bytes(), _mode(tmp_path / "key")) == (b"new key", 0o600)
    assert (tmp_path / "cert").read_bytes() == b"new cert"
