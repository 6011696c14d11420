"""Trust: keys, signatures and provenance of artifacts.

Modules:

* :mod:`~artifactd.trust.keys`: generate, load and identify signing keys.
* :mod:`~artifactd.trust.signatures`: cosign-compatible signatures and attestations,
  verified so that they fail closed.
* :mod:`~artifactd.trust.policy`: the verification policy: whether a digest may be
  installed, re-signed or shown as trusted.
* :mod:`~artifactd.trust.inspection`: what ``inspect`` shows of an artifact's signatures
  and attestations.
* :mod:`~artifactd.trust.provenance`: the SLSA provenance an artifact is attested with.

Nothing is imported here.
"""
