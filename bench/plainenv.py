"""An interpreter that starts as an installed artifactd's does, for the start-up benches.

A development checkout is installed in editable mode: the virtual
environment's ``site-packages`` then holds a ``.pth`` file that imports
setuptools' editable finder (and with it ``pathlib``, ``importlib.util`` and
``urllib.parse``) into every Python process, and other packages add their own
(``nvidia_cutlass_dsl_packages.pth``). A bare ``python -c pass`` there pays
for all of it, about 11-15 ms here, and artifactd then finds those modules
already imported: every ratio to a bare start reads too low. An init container
installs artifactd from a wheel and starts none of them.

:func:`plain_python` makes a new virtual environment (no pip, no packages)
whose ``site-packages`` holds one ``.pth`` file of plain paths: this checkout
first, then the running interpreter's ``site-packages`` for the dependencies.
A path line in a ``.pth`` file imports nothing, and ``.pth`` files in a
directory added that way are not read, so both the bare start and artifactd's
start there are what an installed artifactd's are.

:func:`command` is the ``artifactd`` command there, written as pip 25 writes
a console script (and the init image writes it): a pod runs ``artifactd
restore``, not ``python -m artifactd`` (whose ``runpy`` costs 17 million
instructions more, half a bare start), nor pip 24's script (which imports ``re``:
24 million more).
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def plain_python(work: Path, checkout: Path = REPO) -> str:
    """Make the plain environment under ``work``; return its interpreter.

    ``checkout``: the artifactd source it imports (default: this one).
    """
    venv = work / "plain-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = venv / "lib" / ver / "site-packages"
    paths = dict.fromkeys(
        [str(checkout), sysconfig.get_path("purelib"), sysconfig.get_path("platlib")]
    )
    (site / "artifactd-bench.pth").write_text("".join(f"{p}\n" for p in paths))
    python = venv / "bin" / "python"
    launcher = venv / "bin" / "artifactd"
    launcher.write_text(
        f"#!{python}\nimport sys\nfrom artifactd.cli import main\nsys.exit(main())\n"
    )
    launcher.chmod(0o755)
    return str(python)


def command(python: str) -> list[str]:
    """The ``artifactd`` command of the plain environment whose interpreter is ``python``."""
    return [str(Path(python).parent / "artifactd")]
