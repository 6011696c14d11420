"""What pyproject.toml cannot say: the optional C batch writer, and a pure wheel without it.

``artifactd/format/_batchwrite.c`` (the extractor's batch writer) is built where
a C compiler and Python's headers are, and the wheel is then one for that
Python and platform. It is optional: where it cannot be built, the build goes
on, and the wheel, with nothing compiled in it, is tagged pure
(``py3-none-any``) rather than for one Python it does not need. The
extractor's Python loop does the same work there (docs/performance.md, "The
batch writer").
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.bdist_wheel import bdist_wheel

SOURCE = "artifactd/format/_batchwrite.c"
#: Compiled into the module (``source_sha256``): tests/test_batchwrite.py compares it
#: with the source, so a module built from an older edit of it fails there, not silently.
SOURCE_SHA256 = hashlib.sha256(Path(__file__).parent.joinpath(SOURCE).read_bytes()).hexdigest()

BATCH_WRITER = Extension(
    "artifactd.format._batchwrite",
    sources=[SOURCE],
    libraries=["dl"],  # dlopen: in libc from glibc 2.34, in libdl before
    define_macros=[("SOURCE_SHA256", f'"{SOURCE_SHA256}"')],
    extra_compile_args=["-O2", "-Wall", "-Wextra", "-Werror=implicit-function-declaration"],
    optional=True,
)


class PureWithoutExtension(bdist_wheel):
    """A wheel tagged pure when no extension was built (the optional one failed)."""

    def get_tag(self) -> tuple[str, str, str]:
        """Return the wheel's tag: ``py3-none-any`` when nothing was compiled into it."""
        built = self.get_finalized_command("build_ext").get_outputs()
        if not any(Path(path).is_file() for path in built):
            self.root_is_pure = True
        tag: tuple[str, str, str] = super().get_tag()
        return tag


setup(ext_modules=[BATCH_WRITER], cmdclass={"bdist_wheel": PureWithoutExtension})
