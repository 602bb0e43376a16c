"""docs/quickstart.md as a test runs it: every ```sh block, in order, in bash, as printed.

The blocks run in a workspace that holds what a user's machine holds: a clone of the repository
(its chart, examples and Dockerfile) and `~/agent-lightning`, a checkout of agent-lightning's
SWE-smith example (its template, and the repository's example rows under agent-lightning's file
names). HOME is the workspace, so the page's `~/agent-lightning` is that checkout. `kubectl` and
`helm` are the ones built with the control plane and talk to the real node's cluster
($KUBECONFIG); `ctr` is the node's containerd's ($CONTAINERD_ADDRESS); `image-preflight` is the
test's own install. The page's registry is the test's own (tests/oci_registry.py), whose CA the
terminal trusts as the system's (SSL_CERT_FILE, which Helm's Go TLS reads) and the node's
containerd as a registry's (tests/node/real_node.py, trust_registry).

The page's values are exported in its first block; the test replaces only those it cannot know
the user's answer to, each named in PLACEHOLDERS with why. Exports carry from one block to the
next, as in one terminal. A block followed by a ```text block is a command the page shows
failing: it must exit non-zero and print that text, `...` standing for what differs between
clusters. The lines the test does not run are in SUBSTITUTED, each with why and with what the
test does instead.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.release import VERSION

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "quickstart.md"
AGL_EXAMPLE = Path("agent-lightning") / "examples" / "swe_smith"

# Printed on the page, not run here; what the test does instead.
SUBSTITUTED = {
    f'docker build -t "$REGISTRY/image-preflight:{VERSION}" .':
        "no Docker engine here: tests/node/preflight_image.py builds the same Dockerfile with buildah "
        "--pull=never from local inputs",
    f'docker push "$REGISTRY/image-preflight:{VERSION}"':
        "skopeo pushes that build's OCI archive to $REGISTRY before the page runs (tests/node/installed.py)",
    "pip install '.[kube]'":
        "installing would reach PyPI: the test's own virtualenv has the kube extra",
}


# The page's exported values the test gives its own: the real node is not where a user's node has
# it, and the user's registry is not here.
PLACEHOLDERS = {
    "CRI_SOCKET": "the real node's containerd listens in its own folder (tests/node/real_node.py), as a "
                  "k3s node does elsewhere than the default",
    "REGISTRY": "distribution's registry on the host side of the node's veth (tests/oci_registry.py), "
                "its TLS of a CA of the test's own",
}


@dataclass(frozen=True)
class Block:
    section: str  # the heading it stands under
    text: str  # the commands as printed
    fails_with: str | None  # the ```text block after it: what it prints when it fails as shown


def blocks(page: Path = PAGE) -> list[Block]:
    found: list[Block] = []
    section = ""
    parts = re.split(r"^(```\w*\n.*?^```\n|#+ [^\n]*\n)", page.read_text(encoding="utf-8"), flags=re.M | re.S)
    for index, part in enumerate(parts):
        if part.startswith("#"):
            section = part.lstrip("#").strip()
        elif part.startswith("```sh\n"):
            following = next((p for p in parts[index + 1:] if p.strip()), "")
            fails_with = following[len("```text\n"):-len("```\n")] if following.startswith("```text\n") else None
            found.append(Block(section, part[len("```sh\n"):-len("```\n")], fails_with))
    return found


def runnable(text: str, values: dict[str, str] | None = None) -> str:
    """The block less its SUBSTITUTED lines (a continued line counts whole), each PLACEHOLDERS
    export given the test's value from `values`."""
    out = []
    for line in text.replace("\\\n", "\0").splitlines():
        if line.split("#")[0].strip().replace("\0", " ") in SUBSTITUTED:
            continue
        if (match := re.match(r"export (\w+)=", line)) and match[1] in PLACEHOLDERS:
            line = f"export {match[1]}={shlex.quote((values or {})[match[1]])}"
        out.append(line)
    return "\n".join(out).replace("\0", "\\\n") + "\n"


def matches(expected: str, output: str) -> bool:
    """`expected` as the page shows it: wrapped where the page wraps, `...` for anything."""
    words = " ".join(expected.split())
    pattern = ".*?".join(re.escape(piece) for piece in words.split("..."))
    return re.search(pattern, " ".join(output.split()), re.S) is not None


class Terminal:
    """One user's terminal in `workspace`: bash, the environment carried from block to block."""

    def __init__(self, workspace: Path, env: dict[str, str], values: dict[str, str]) -> None:
        self.workspace = workspace
        self.state = workspace / ".terminal-env"
        self.env = env
        self.values = values  # PLACEHOLDERS' values
        self.state.write_text("")

    def run(self, text: str, timeout: float = 600) -> subprocess.CompletedProcess:
        script = (f"set -euo pipefail\nsource {self.state}\n{text}\n"
                  f"export -p | grep -v -e ' PWD=' -e ' OLDPWD=' -e ' SHLVL=' > {self.state}\n")
        return subprocess.run(["bash", "-c", script], cwd=self.workspace, env=self.env, capture_output=True,
                              text=True, timeout=timeout, check=False)

    def block(self, block: Block) -> str:
        done = self.run(runnable(block.text, self.values))
        output = done.stdout + done.stderr
        if block.fails_with is None:
            assert done.returncode == 0, f"{block.section}:\n{block.text}\nexited {done.returncode}:\n{output}"
        else:
            assert done.returncode != 0, f"{block.section}: expected to fail:\n{block.text}\nprinted:\n{output}"
            assert matches(block.fails_with, output), f"{block.section}: printed\n{output}\nnot\n{block.fails_with}"
        return output


def workspace(folder: Path, agl_files: dict[str, Path]) -> Path:
    """The user's machine: the clone and ~/agent-lightning."""
    home = folder / "quickstart"
    clone = home / "image-preflight"
    for part in ("deploy", "examples", "docs"):
        shutil.copytree(ROOT / part, clone / part)
    example = home / AGL_EXAMPLE
    example.mkdir(parents=True)
    for name, source in agl_files.items():
        shutil.copy(source, example / name)
    return clone


def environment(home: Path, *, kubeconfig: Path, containerd_socket: Path, path_first: list[Path],
                trusted_ca: Path) -> dict[str, str]:
    return {"HOME": str(home), "KUBECONFIG": str(kubeconfig), "CONTAINERD_ADDRESS": str(containerd_socket),
            "PATH": os.pathsep.join([*map(str, path_first), os.environ["PATH"]]), "LANG": "C.UTF-8",
            "NO_COLOR": "1", "SSL_CERT_FILE": str(trusted_ca)}
