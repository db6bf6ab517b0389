"""Frozen features on disk: what an encoder computed of a set of files, written once and read by row.

Read ``feature_set.py`` first (the one feature-set format: the manifest ``store.json``, the index, the
layouts, the units and their done rule, the reader ``FeatureSet``), then its two row cutters: ``store.py``
(the probes' stores: each labelled file × segment × crop, or K augmented training views) and ``extract.py``
(what ``levjepa extract`` runs: each file × time window, streaming included). ``writer.py`` is the one way
arrays reach the disk, ``check.py`` the checksums a reader verifies; ``readout.py`` and ``compact.py`` say
what is kept of the tokens (per-frame, last-slot and pooled readouts; compact token codecs). ``cache.py``
computes features in memory and caches them by the encoder's function fingerprint. The probes that read
all this live in ``levjepa.eval``.
"""
