"""Build: turn a matrix into published artifacts, and gate them.

Modules:

* :mod:`~artifactd.build.matrix`: the build matrix (cells, axes, ``env:``).
* :mod:`~artifactd.build.shapes`: serve requests from an engine's traffic metrics.
* :mod:`~artifactd.build.scrape`: read a metrics file or URL, bounded.
* :mod:`~artifactd.build.matrix_edit`: write a matrix's ``serve.requests`` in place.
* :mod:`~artifactd.build.schedule`: assign cells to workers and GPUs.
* :mod:`~artifactd.build.launch`: start every cell in its own process group; stop the group.
* :mod:`~artifactd.build.cells`: run one warm-up cell (serve, send requests, stop).
* :mod:`~artifactd.build.run`: the ``build`` command: cells, harvest, publish.
* :mod:`~artifactd.build.harvest`: harvest a machine's caches into an artifact.
* :mod:`~artifactd.build.treemerge`: merge cells' cache trees file by file.
* :mod:`~artifactd.build.merge`: merge cells' partial artifacts into one.
* :mod:`~artifactd.build.published`: the one published fingerprint of a matrix.
* :mod:`~artifactd.build.gate`: the ``verify`` gate (replay, compare, compiled anyway).
* :mod:`~artifactd.build.absorb`: screen the deltas pods contributed into a candidate.
* :mod:`~artifactd.build.candidate`: ``verify --candidate``: proof pass, gate, promotion.
* :mod:`~artifactd.build.demo`: the CPU demo matrix and caches.

Nothing is imported here.
"""
