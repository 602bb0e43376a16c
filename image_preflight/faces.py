"""The faces of the tool and what each install brings: the one list the package, the CLI's checks
and the tests read.

Each face keeps its folder at the top of the repository and is installed inside the package as
image_preflight.<face> (pyproject.toml's package-dir, which a test holds to this list).
"""

FACES = ("webhook", "scanner", "certs", "agent", "inventory", "watchdog", "doctor")

# pyproject.toml's dependencies, as imported: without one of them the base install is incomplete.
BASE_MODULES = ("jinja2", "yaml", "pyarrow", "numpy", "rich")
# The modules each extra brings that the code imports (tests hold them to pyproject.toml); an extra
# naming another brings that one's too.
EXTRA_MODULES = {
    "kube": ("kubernetes",),
    "webhook": ("kubernetes", "fastapi", "starlette", "uvicorn", "uvloop", "orjson", "cryptography",
                "prometheus_client"),
    "agent": ("kubernetes", "grpc", "google.protobuf", "prometheus_client"),
    "watchdog": ("kubernetes", "prometheus_client"),
    "test": ("pytest", "build", "httpx", "kubernetes_validate", "jsonschema", "kr8s", "opentelemetry.proto"),
}


def extra_top_levels() -> frozenset[str]:
    """The top-level import names only the extras bring."""
    return frozenset(module.partition(".")[0] for modules in EXTRA_MODULES.values() for module in modules)
