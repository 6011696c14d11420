"""Trust: keys, signatures and provenance of artifacts.

Modules:

* :mod:`~artifactd.trust.keys`: generate, load and identify signing keys.
* :mod:`~artifactd.trust.signatures`: cosign-compatible signatures and attestations;
  the verification policy.
* :mod:`~artifactd.trust.provenance`: the SLSA provenance an artifact is attested with.

Nothing is imported here.
"""
