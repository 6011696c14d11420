"""The C batch writer (``_batchwrite.c``): see ``artifactd.format.unpack._load_batch_writer``."""

def write_batch(
    items: list[tuple[str, bytes | memoryview, int, str | None, int | None]], umask: int, /
) -> int:
    """Create files in order until the first that fails; return how many were created."""
