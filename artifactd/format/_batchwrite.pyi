"""The C batch writer (``_batchwrite.c``): see ``artifactd.format.unpack._load_batch_writer``."""

#: The sha256 of ``_batchwrite.c`` as it was built (``unknown`` when not built by setup.py).
source_sha256: str

def write_batch(
    items: list[tuple[str, bytes | memoryview, int, str | None, int | None]], umask: int, /
) -> int:
    """Create files in order until the first that fails; return how many were created."""
