"""The faces of the tool: the one list the package, the CLI's checks and the tests read.

Each face keeps its folder at the top of the repository and is installed inside the package as
image_preflight.<face> (pyproject.toml's package-dir, which a test holds to this list).
"""

FACES = ("webhook", "scanner", "certs", "agent", "watchdog", "doctor")
