"""The ``artifactd`` click group, bare: the command modules decorate it.

:mod:`artifactd.cli.app` imports it with every command module, so that
importing the app registers every command; a command module imports the group
from here, never the app, so no import goes round in a circle.
"""

from __future__ import annotations

import click

from artifactd import __version__
from artifactd.cli.render import VERSION_LINE


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="artifactd", message=VERSION_LINE)
def cli() -> None:
    """Fingerprinted compile caches for LLM inference pods.

    \b
    Build once, restore everywhere:
      artifactd build warmup_matrices/cpu-demo.yaml     # CI: warm up, harvest, push
      artifactd restore --target /cache                 # init container: install warm caches
      artifactd diff local oci:.artifactd/store:TAG     # operator: why did this pod recompile?

    The default store is a local OCI layout directory (oci:.artifactd/store);
    set ARTIFACTD_STORE or pass --store. Run `artifactd demo` for a timed round trip.
    """
