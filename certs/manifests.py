"""Kubernetes manifests that carry the certificates: a TLS Secret and webhook caBundles."""

from __future__ import annotations

import base64
import stat
from dataclasses import dataclass
from pathlib import Path

import yaml

from image_preflight.errors import InputError
from image_preflight.files.atomic import write_atomic

WEBHOOK_KINDS = ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration")


@dataclass(frozen=True, slots=True)
class PatchResult:
    configurations: int
    webhooks: int
    # "<webhook name> -> <service>.<namespace>" for webhooks that call another Service
    other_services: tuple[str, ...]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def tls_secret(name: str, namespace: str, cert_pem: bytes, key_pem: bytes, ca_pem: bytes) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "type": "kubernetes.io/tls",
        "data": {"tls.crt": b64(cert_pem), "tls.key": b64(key_pem), "ca.crt": b64(ca_pem)},
    }


def to_yaml(manifest: dict) -> str:
    return yaml.safe_dump(manifest, sort_keys=False)


def set_ca_bundle(
    text: str, source: str, ca_bundle: str, service: str, namespace: str
) -> tuple[str, PatchResult]:
    """`text` with caBundle set on every webhook of every webhook configuration in it.

    Other documents keep their exact text, comments included; patched ones are re-serialized.
    """
    try:
        documents = list(yaml.safe_load_all(text))
        spans = _document_spans(text)
    except yaml.YAMLError as exc:
        raise InputError(f"{source}: not valid YAML: {_yaml_problem(exc)}") from None

    pieces: list[str] = []
    cursor = configurations = webhooks = 0
    other_services: list[str] = []
    for number, (document, span) in enumerate(zip(documents, spans), start=1):
        if not (isinstance(document, dict) and document.get("kind") in WEBHOOK_KINDS):
            continue
        where = f"{source}: document {number} ({document['kind']} {_name(document)})"
        for hook in _patch_webhooks(document, where, ca_bundle):
            webhooks += 1
            target = _service_of(hook)
            if target is not None and target != f"{service}.{namespace}":
                other_services.append(f"{hook.get('name', '?')} -> {target}")
        configurations += 1
        start, end, explicit_start, explicit_end = span
        pieces.append(text[cursor:start])
        pieces.append(
            ("---\n" if explicit_start else "")
            + yaml.safe_dump(document, sort_keys=False)
            + ("..." if explicit_end else "")
        )
        cursor = end
    if configurations == 0:
        raise InputError(f"{source}: no {' or '.join(WEBHOOK_KINDS)} to patch")
    pieces.append(text[cursor:])
    return "".join(pieces), PatchResult(configurations, webhooks, tuple(other_services))


def patch_webhook_file(
    path: Path, ca_pem: bytes, service: str, namespace: str
) -> PatchResult:
    """Set caBundle in the user's manifest file in place, keeping its permissions."""
    write, result = webhook_patch(path, ca_pem, service, namespace)
    if write is not None:
        write_atomic(*write)
    return result


def webhook_patch(
    path: Path, ca_pem: bytes, service: str, namespace: str
) -> tuple[tuple[Path, bytes, int] | None, PatchResult]:
    """What patch_webhook_file would write, as (path, data, mode), None when nothing changes;
    written nowhere yet."""
    try:
        text = path.read_text(encoding="utf-8")
        mode = stat.S_IMODE(path.stat().st_mode)
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    new_text, result = set_ca_bundle(text, str(path), b64(ca_pem), service, namespace)
    # Write through a symlink rather than replacing the link with a file.
    return ((path.resolve(), new_text.encode("utf-8"), mode) if new_text != text else None), result


def _patch_webhooks(document: dict, where: str, ca_bundle: str) -> list[dict]:
    hooks = document.get("webhooks")
    if hooks is None:
        return []
    if not isinstance(hooks, list):
        raise InputError(f"{where}: webhooks is not a list")
    for index, hook in enumerate(hooks):
        if not isinstance(hook, dict):
            raise InputError(f"{where}: webhooks[{index}] is not a mapping")
        client_config = hook.get("clientConfig")
        if not isinstance(client_config, dict):
            raise InputError(f"{where}: webhooks[{index}].clientConfig is missing or not a mapping")
        client_config["caBundle"] = ca_bundle
    return hooks


def _service_of(hook: dict) -> str | None:
    service = hook["clientConfig"].get("service")
    if not isinstance(service, dict):
        return None  # a url webhook; no Service to compare
    return f"{service.get('name')}.{service.get('namespace')}"


def _document_spans(text: str) -> list[tuple[int, int, bool, bool]]:
    """(start, end, explicit '---', explicit '...') of each document, as character offsets."""
    spans: list[tuple[int, int, bool, bool]] = []
    start, explicit_start = 0, False  # each document's end follows its start
    for event in yaml.parse(text):
        if isinstance(event, yaml.DocumentStartEvent):
            start, explicit_start = event.start_mark.index, event.explicit
        elif isinstance(event, yaml.DocumentEndEvent):
            spans.append((start, event.end_mark.index, explicit_start, event.explicit))
    return spans


def _name(document: dict) -> str:
    metadata = document.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return str(name) if name else "<unnamed>"


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"line {mark.line + 1}: {problem}" if mark is not None else problem
