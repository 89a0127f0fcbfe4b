"""Bench tier: all-reduce bandwidth, GEMM TFLOP/s and serving throughput, measured inside each image.

The in-image scripts live in :mod:`stackforge.bench.scripts` (standalone files, stdlib + torch);
the host side plans runs (:mod:`stackforge.bench.catalog`, :mod:`stackforge.bench.run`) and turns
their ``STACKFORGE_RESULT`` lines into records; :mod:`stackforge.bench.campaign` is what
``stackforge bench`` runs. Formulas (:mod:`stackforge.bench.metrics`) and
statistics (:mod:`stackforge.bench.stats`) are pure and shared by both sides.
"""
