"""`certs`' flags as its frozen config holds them; the library's errors are input errors, shown by
the command as one line."""

from __future__ import annotations

import pytest

from image_preflight.certs import authority
from image_preflight.certs.config import CertsConfig
from image_preflight.certs.manifests import patch_webhook_file
from image_preflight.certs.request import KEY_KINDS, CertRequest
from image_preflight.cli import build_parser, main
from image_preflight.errors import InputError, UsageError


def test_the_flags_defaults_are_the_requests_and_every_key_kind_offered_makes_a_key(tmp_path):
    parser, _ = build_parser("certs")
    args = parser.parse_args(["certs", "--service", "gate", "--namespace", "jobs", "--out-dir", str(tmp_path)])
    assert CertsConfig.from_args(args).request == CertRequest("gate", "jobs")
    for kind in KEY_KINDS:
        assert authority.key_kind(authority.new_private_key(kind)) == kind


def test_the_config_names_the_flag_it_refuses(tmp_path):
    with pytest.raises(UsageError, match=r"^--renew-before 400: must be less than --days 365$"):
        CertsConfig("gate", "jobs", tmp_path, renew_before=400)
    with pytest.raises(UsageError, match=r"^--days 0: must be 1 or more$"):
        CertsConfig("gate", "jobs", tmp_path, days=0)
    assert CertsConfig("gate", "jobs", tmp_path).secret_named == "gate-tls"


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
