"""`certs`' flags as its frozen config holds them; the library's errors are input errors, shown by
the command as one line."""

from __future__ import annotations

import pytest

from image_preflight.certs import authority
from image_preflight.certs.config import KEY_KINDS, CertsConfig
from image_preflight.certs.manifests import patch_webhook_file
from image_preflight.cli import main
from image_preflight.errors import InputError, UsageError


def test_the_key_kinds_offered_are_the_authoritys():
    assert KEY_KINDS == authority.KEY_KINDS


def test_the_config_names_the_flag_it_refuses(tmp_path):
    with pytest.raises(UsageError, match=r"^--renew-before: 400 must be less than --days 365$"):
        CertsConfig(service="gate", namespace="jobs", out_dir=tmp_path, renew_before=400)
    assert CertsConfig(service="gate", namespace="jobs", out_dir=tmp_path).secret_name == "gate-tls"


def test_a_bad_webhook_file_is_an_input_error_and_one_line_from_the_command(tmp_path, capsys):
    broken = tmp_path / "webhook.yaml"
    broken.write_text("kind: [\n")
    with pytest.raises(InputError) as raised:
        patch_webhook_file(broken, b"PEM", "gate", "jobs")
    assert not isinstance(raised.value, UsageError)
    code = main(["certs", "--service", "gate", "--namespace", "jobs", "--out-dir", str(tmp_path / "out"),
                 "--patch-webhook", str(broken)])
    assert code == 2
    *reports, line = capsys.readouterr().err.strip().splitlines()  # the certificates written, then why it stopped
    assert line.startswith(f"image-preflight certs: {broken}: not valid YAML: ") and "Traceback" not in reports
