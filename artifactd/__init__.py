"""artifactd: fingerprinted compile-artifact build system and registry.

Build once on a GPU of one architecture, store the JIT compile caches as OCI
artifacts keyed by a compatibility fingerprint, and restore them into the
writable cache volumes of every inference pod so the engine starts warm.
"""

__version__ = "0.1.0"
