"""What a certificate run is asked for, and its defaults: the one place both the flags and the
store read them. Free of cryptography, so that `certs --help` stays light."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

KeyKind = Literal["ecdsa", "rsa"]
KEY_KINDS: tuple[KeyKind, ...] = ("ecdsa", "rsa")

DAYS = 365
CA_DAYS = 3650
RENEW_BEFORE_DAYS = 30
KEY_KIND: KeyKind = "ecdsa"
# The longest lifetime asked for: a hundred years, what the longest-lived CAs are given. Any
# certificate so bounded ends long before X.509's last date (9999-12-31, RFC 5280 4.1.2.5), which
# is also datetime's.
MAX_DAYS = 36500


@dataclass(frozen=True, slots=True)
class CertRequest:
    service: str
    namespace: str
    days: int = DAYS
    ca_days: int = CA_DAYS
    renew_before_days: int = RENEW_BEFORE_DAYS
    key_kind: KeyKind = KEY_KIND
