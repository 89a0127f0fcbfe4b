"""Capability probes: scripts that run inside a stack image, and the catalog that names them.

The scripts live in :mod:`stackforge.probes.scripts` (standalone files, mounted read-only into a
container at ``/stackforge/probes``); :mod:`stackforge.probes.catalog` says which exist, what they
decide and what they need; :mod:`stackforge.probes.campaign` is what ``stackforge probe`` runs.
"""
