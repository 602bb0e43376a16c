"""Image references parsed and normalized exactly as github.com/distribution/reference does.

A port of distribution/reference (regexp.go, reference.go, normalize.go, helpers.go) and of the
digest validation in github.com/opencontainers/go-digest v1.0.0, so that a name means here what
it means to docker, containerd and the kubelet. Go's "" (no domain, tag or digest) is None here.

Digests: docker and containerd link crypto/sha512, so sha384/sha512 digests validate there; that
is the default. `allow_sha512=False` gives the behaviour of a program that registers only sha256
(as the upstream tests do).

Go RE2 versus Python `re`: every pattern is compiled with re.ASCII (RE2's \\w is ASCII), anchored
with \\A...\\Z (Python's `$` also matches before a trailing newline) and used with fullmatch;
[[:xdigit:]] is spelled out. Submatches agree because RE2 also picks the leftmost-first match.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar, cast

from image_preflight.errors import InputError

NAME_TOTAL_LENGTH_MAX = 255  # RepositoryNameTotalLengthMax
DEFAULT_DOMAIN = "docker.io"
LEGACY_DEFAULT_DOMAIN = "index.docker.io"
OFFICIAL_REPO_PREFIX = "library/"
DEFAULT_TAG = "latest"
CACHE_SIZE = 65536
# A name is at most 255 characters (NameTotalLengthMax), a tag 128, a digest 135 (sha512): longer
# strings are invalid or freak, and are parsed every time rather than kept.
CACHEABLE_LENGTH = 520


# --- regexp.go -----------------------------------------------------------------------------


def _optional(*res: str) -> str:
    return "(?:" + "".join(res) + ")?"


def _any_times(*res: str) -> str:
    return "(?:" + "".join(res) + ")*"


def _capture(*res: str) -> str:
    return "(" + "".join(res) + ")"


def _anchored(*res: str) -> str:
    return r"\A" + "".join(res) + r"\Z"


_ALPHANUMERIC = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|[-]+)"
_LOCALHOST = "localhost"
_DOMAIN_NAME_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_OPTIONAL_PORT = r"(?::[0-9]+)?"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*[:][0-9A-Fa-f]{32,}"
_IDENTIFIER = r"([a-f0-9]{64})"
_IPV6_ADDRESS = r"\[(?:[a-fA-F0-9:]+)\]"
_DOMAIN_NAME = _DOMAIN_NAME_COMPONENT + r"(?:\." + _DOMAIN_NAME_COMPONENT + ")*"
_HOST = "(?:" + _DOMAIN_NAME + "|" + _IPV6_ADDRESS + ")"
_DOMAIN_AND_PORT = _HOST + _OPTIONAL_PORT
_PATH_COMPONENT = _ALPHANUMERIC + _any_times(_SEPARATOR + _ALPHANUMERIC)
_REMOTE_NAME = _PATH_COMPONENT + _any_times("/" + _PATH_COMPONENT)
_NAME = _optional(_DOMAIN_AND_PORT + "/") + _REMOTE_NAME


def _compile(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.ASCII)


# All anchored: Go's anchored variants, or Go's exported ones wrapped in ^...$ as its tests do.
TAG_RE = _compile(_anchored(_TAG))
DIGEST_RE = _compile(_anchored(_DIGEST))
IDENTIFIER_RE = _compile(_anchored(_IDENTIFIER))
NAME_RE = _compile(_anchored(_optional(_capture(_DOMAIN_AND_PORT), "/"), _capture(_REMOTE_NAME)))
REFERENCE_RE = _compile(
    _anchored(_capture(_NAME), _optional(":", _capture(_TAG)), _optional("@", _capture(_DIGEST)))
)


# --- errors --------------------------------------------------------------------------------

# Go error text by the name the conformance data uses (digest.* are go-digest's).
_MESSAGES = {
    "ErrReferenceInvalidFormat": "invalid reference format",
    "ErrTagInvalidFormat": "invalid tag format",
    "ErrDigestInvalidFormat": "invalid digest format",
    "ErrNameContainsUppercase": "repository name must be lowercase",
    "ErrNameEmpty": "repository name must have at least one component",
    "ErrNameTooLong": f"repository name must not be more than {NAME_TOTAL_LENGTH_MAX} characters",
    "ErrNameNotCanonical": "repository name must be canonical",
    "digest.ErrDigestInvalidFormat": "invalid checksum digest format",
    "digest.ErrDigestInvalidLength": "invalid checksum digest length",
    "digest.ErrDigestUnsupported": "unsupported digest algorithm",
}


class InvalidReference(InputError):
    """`ref` is not a valid image reference.

    `error` is the Go error name ("ErrReferenceInvalidFormat", "digest.ErrDigestUnsupported",
    ...; "ErrRepoNameIsHexIdentifier" and "ErrRemoteNameNotLowercase" for Go's unnamed
    fmt.Errorf values); `detail` is Go's error text.
    """

    def __init__(self, ref: object, error: str, detail: str | None = None) -> None:
        self.ref = ref
        self.error = error
        self.detail = detail if detail is not None else _MESSAGES[error]
        super().__init__(f"invalid image reference {_quote(ref)}: {_one_line(self.detail)}")

    def __reduce__(self) -> tuple[type[InvalidReference], tuple[object, str, str]]:
        # pickles across processes despite the custom __init__
        return (type(self), (self.ref, self.error, self.detail))


def _quote(ref: object, limit: int = 200) -> str:
    if isinstance(ref, str) and len(ref) > limit:
        return f"{ref[:limit]!r}... ({len(ref)} characters)"
    return repr(ref)


def _one_line(text: str) -> str:
    return text if text.isprintable() else repr(text)[1:-1]


def _go_lower(s: str) -> str:
    """strings.ToLower: rune by rune, simple case mapping (Python's str.lower maps U+0130 to two
    characters and applies the final-sigma rule)."""
    if s.isascii():
        return s.lower()
    return "".join("i" if c == "\u0130" else c.lower() for c in s)


# --- go-digest v1.0.0 ----------------------------------------------------------------------

_GO_DIGEST_RE = re.compile(r"[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-zA-Z0-9=_-]+", re.ASCII)
_HEX_RE = {n: re.compile(f"[a-f0-9]{{{n}}}", re.ASCII) for n in (64, 96, 128)}
_SHA256_ONLY = {"sha256": 64}
_WITH_SHA512 = {"sha256": 64, "sha384": 96, "sha512": 128}  # crypto/sha512 provides both


def _digest_error(s: str, allow_sha512: bool) -> str | None:
    """digest.Digest.Validate: the error name, or None when valid."""
    i = s.find(":")
    if i <= 0 or i + 1 == len(s):
        return "digest.ErrDigestInvalidFormat"
    algorithm, encoded = s[:i], s[i + 1 :]
    hex_len = (_WITH_SHA512 if allow_sha512 else _SHA256_ONLY).get(algorithm)
    if hex_len is None:  # not Available()
        if _GO_DIGEST_RE.fullmatch(s) is None:
            return "digest.ErrDigestInvalidFormat"
        return "digest.ErrDigestUnsupported"
    if len(encoded.encode("utf-8", "surrogatepass")) != hex_len:  # Go's len counts bytes
        return "digest.ErrDigestInvalidLength"
    if _HEX_RE[hex_len].fullmatch(encoded) is None:
        return "digest.ErrDigestInvalidFormat"
    return None


def is_valid_digest(digest: str, *, allow_sha512: bool = True) -> bool:
    """digest.Parse(digest) succeeds."""
    return _digest_error(digest, allow_sha512) is None


# --- reference.go --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reference:
    """A named reference; None where Go has "" (no domain, tag or digest)."""

    domain: str | None
    path: str
    tag: str | None = None
    digest: str | None = None

    @property
    def name(self) -> str:
        return f"{self.domain}/{self.path}" if self.domain else self.path

    def __str__(self) -> str:
        text = self.name
        if self.tag:
            text += ":" + self.tag
        if self.digest:
            text += "@" + self.digest
        return text


def _parse(s: str, allow_sha512: bool) -> Reference:
    """reference.Parse."""
    if s == "":
        raise InvalidReference(s, "ErrNameEmpty")
    match = REFERENCE_RE.fullmatch(s)
    if match is None:
        lowered = _go_lower(s)
        if lowered != s and REFERENCE_RE.fullmatch(lowered) is not None:
            # Succeeds when lower-cased, so the repository name has upper case.
            raise InvalidReference(s, "ErrNameContainsUppercase")
        raise InvalidReference(s, "ErrReferenceInvalidFormat")
    name, tag, digest = match.groups()
    name_match = NAME_RE.fullmatch(name)
    if name_match is not None:
        domain, path = name_match.groups()
    else:
        domain, path = None, name
    if len(path) > NAME_TOTAL_LENGTH_MAX:
        raise InvalidReference(s, "ErrNameTooLong")
    if digest:
        error = _digest_error(digest, allow_sha512)
        if error:
            raise InvalidReference(s, error)
    # getBestReferenceType: the grammar never yields an empty name, so every result is named.
    return Reference(domain or None, path, tag or None, digest or None)


def with_name(name: str) -> Reference:
    """reference.WithName: a name only, not normalized."""
    match = NAME_RE.fullmatch(name) if isinstance(name, str) else None
    if match is None:
        raise InvalidReference(name, "ErrReferenceInvalidFormat")
    domain, path = match.groups()
    if len(path) > NAME_TOTAL_LENGTH_MAX:
        raise InvalidReference(name, "ErrNameTooLong")
    return Reference(domain or None, path)


def with_tag(ref: Reference, tag: str) -> Reference:
    """reference.WithTag: keeps the digest, if any."""
    if TAG_RE.fullmatch(tag) is None:
        raise InvalidReference(f"{ref}:{tag}", "ErrTagInvalidFormat")
    return Reference(ref.domain, ref.path, tag, ref.digest)


def with_digest(ref: Reference, digest: str) -> Reference:
    """reference.WithDigest: checks the digest's shape only, not its algorithm; keeps the tag."""
    if DIGEST_RE.fullmatch(digest) is None:
        raise InvalidReference(f"{ref}@{digest}", "ErrDigestInvalidFormat")
    return Reference(ref.domain, ref.path, ref.tag, digest)


# --- normalize.go ---------------------------------------------------------------------------


def _split_docker_domain(name: str) -> tuple[str, str]:
    maybe_domain, sep, maybe_remote = name.partition("/")
    if not sep:
        # A single element ("ubuntu", "ubuntu:latest") is never a host, not even "localhost".
        return DEFAULT_DOMAIN, OFFICIAL_REPO_PREFIX + name
    if maybe_domain == _LOCALHOST:
        domain, remote = maybe_domain, maybe_remote
    elif maybe_domain == LEGACY_DEFAULT_DOMAIN:
        domain, remote = DEFAULT_DOMAIN, maybe_remote
    elif "." in maybe_domain or ":" in maybe_domain:
        domain, remote = maybe_domain, maybe_remote
    elif _go_lower(maybe_domain) != maybe_domain:
        # Namespaces are lower case, so an upper-case first element must be a host.
        domain, remote = maybe_domain, maybe_remote
    else:
        domain, remote = DEFAULT_DOMAIN, name
    if domain == DEFAULT_DOMAIN and "/" not in remote:
        remote = OFFICIAL_REPO_PREFIX + remote
    return domain, remote


def _parse_normalized(s: str, allow_sha512: bool) -> Reference:
    """reference.ParseNormalizedNamed."""
    if IDENTIFIER_RE.fullmatch(s) is not None:
        raise InvalidReference(
            s,
            "ErrRepoNameIsHexIdentifier",
            f"invalid repository name ({s}), cannot specify 64-byte hexadecimal strings",
        )
    domain, remainder = _split_docker_domain(s)
    colon = remainder.find(":")
    remote = remainder[:colon] if colon > -1 else remainder
    if _go_lower(remote) != remote:
        raise InvalidReference(
            s,
            "ErrRemoteNameNotLowercase",
            f"invalid reference format: repository name ({remote}) must be lowercase",
        )
    try:
        return _parse(domain + "/" + remainder, allow_sha512)
    except InvalidReference as exc:
        raise InvalidReference(s, exc.error, exc.detail) from None


def _familiarize(ref: Reference) -> Reference:
    """familiarizeName: drop "docker.io" and a "library/" prefix directly under it."""
    if ref.domain != DEFAULT_DOMAIN:
        return ref
    path = ref.path
    if path.startswith(OFFICIAL_REPO_PREFIX):
        remainder = path[len(OFFICIAL_REPO_PREFIX) :]
        if "/" not in remainder:
            path = remainder
    return Reference(None, path, ref.tag, ref.digest)


def _tag_name_only(ref: Reference) -> Reference:
    """TagNameOnly: add ":latest" when there is neither tag nor digest."""
    if ref.tag is None and ref.digest is None:
        return with_tag(ref, DEFAULT_TAG)
    return ref


def _parse_docker_ref(s: str, allow_sha512: bool) -> Reference:
    """reference.ParseDockerRef: drop the tag when a digest is present."""
    named = _parse_normalized(s, allow_sha512)
    if named.tag is not None and named.digest is not None:
        return with_digest(with_name(named.name), named.digest)
    return _tag_name_only(named)


# --- public entry points -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Failure:
    error: str
    detail: str


def _require_str(ref: object) -> str:
    if not isinstance(ref, str):
        raise InvalidReference(ref, "ErrReferenceInvalidFormat", "invalid reference format: not a string")
    return ref


T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class _Memoized(Protocol[T_co]):
    """What _memoized makes of fn(ref, allow_sha512): fn(ref, *, allow_sha512=True), with its cache's
    cache_info() and cache_clear()."""

    cache_info: Callable[[], tuple[int, int, int | None, int]]  # hits, misses, maxsize, currsize
    cache_clear: Callable[[], None]

    def __call__(self, ref: str, *, allow_sha512: bool = True) -> T_co: ...


def _uncached(fn: Callable[[str, bool], T], ref: str, allow_sha512: bool) -> T | _Failure:
    try:
        return fn(ref, allow_sha512)
    except InvalidReference as exc:
        return _Failure(exc.error, exc.detail)


def _memoized(fn: Callable[[str, bool], T]) -> _Memoized[T]:
    """Wrap fn(ref, allow_sha512) as fn(ref, *, allow_sha512=True), caching outcomes, failures
    included: a failure raises a fresh InvalidReference on every call."""

    @functools.lru_cache(maxsize=CACHE_SIZE)
    def outcome(ref: str, allow_sha512: bool) -> T | _Failure:
        return _uncached(fn, ref, allow_sha512)

    def cached(ref: str, *, allow_sha512: bool = True) -> T:
        if not isinstance(ref, str):  # also keeps unhashable values away from the cache
            _require_str(ref)
        # Only references of a plausible length are remembered: the cache's bytes stay bounded
        # (CACHE_SIZE x CACHEABLE_LENGTH) whatever lengths a client sends.
        result = outcome(ref, allow_sha512) if len(ref) <= CACHEABLE_LENGTH else _uncached(fn, ref, allow_sha512)
        if isinstance(result, _Failure):
            raise InvalidReference(ref, result.error, result.detail)
        return result

    cached.__name__, cached.__qualname__, cached.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
    memoized = cast("_Memoized[T]", cached)  # a function with its cache's methods set on it below
    memoized.cache_info = outcome.cache_info
    memoized.cache_clear = outcome.cache_clear
    return memoized


def parse(ref: str, *, allow_sha512: bool = True) -> Reference:
    """reference.Parse: no normalization ("ubuntu" keeps domain None)."""
    return _parse(_require_str(ref), allow_sha512)


@_memoized
def parse_normalized(ref: str, allow_sha512: bool) -> Reference:
    """reference.ParseNormalizedNamed: "ubuntu" -> docker.io/library/ubuntu (no default tag)."""
    return _parse_normalized(ref, allow_sha512)


@_memoized
def normalize(ref: str, allow_sha512: bool) -> str:
    """ParseNormalizedNamed(ref).String(): tag and digest kept, no default tag."""
    return str(_parse_normalized(ref, allow_sha512))


@_memoized
def docker_ref(ref: str, allow_sha512: bool) -> str:
    """ParseDockerRef(ref).String(): ":latest" when untagged, the tag dropped beside a digest."""
    return str(_parse_docker_ref(ref, allow_sha512))


def familiar(ref: str, *, allow_sha512: bool = True) -> str:
    """FamiliarString(ParseNormalizedNamed(ref)): "docker.io/library/ubuntu:1" -> "ubuntu:1"."""
    return str(_familiarize(parse_normalized(ref, allow_sha512=allow_sha512)))
