"""The vocabulary every stage shares: errors, the frozen specs (``Stack``, ``Target``), result records,
the wheel tier's readings, YAML and version parsing, atomic writes, the JSON envelope, shipped data paths.

Nothing here runs a process, talks to an engine or an index; every other folder may import it.
"""
