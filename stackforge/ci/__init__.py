"""CI: the nightly workflow (GitHub Actions) that shards a plan, builds, probes and regenerates the matrix.
"""
