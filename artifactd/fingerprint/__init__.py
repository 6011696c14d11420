"""The fingerprint: what a machine and its software are, and the keys derived from it.

Modules:

* :mod:`~artifactd.fingerprint.model`: the typed :class:`Fingerprint` (pydantic), for
  commands that validate or display one.
* :mod:`~artifactd.fingerprint.probe`: probe this machine into a plain fingerprint
  document, fast (NVML, dist-info, toolchains), started early and answered later
  (typed by the model only on request: ``probe_fingerprint``).
* :mod:`~artifactd.fingerprint.tools`: the toolchains' ``--version`` (``nvcc``,
  ``ptxas``, the C compiler), run side by side without :mod:`subprocess`.
* :mod:`~artifactd.fingerprint.key`: the canonical hash, per-family scope keys, and
  parsing of what a command states (``--workload``, ``--set``, ``--gpu-arch``).
* :mod:`~artifactd.fingerprint.probecache`: the probe's on-disk cache of library hashes.
* :mod:`~artifactd.fingerprint.diff`: explain why two fingerprints differ.
* :mod:`~artifactd.fingerprint.declare`: the flags that would declare an artifact's
  fields on this machine, and the probed fields no flag may change.

Nothing is imported here: a no-op restore loads only ``probe``, ``tools`` and ``key``.
"""
