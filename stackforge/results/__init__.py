"""The results store: run folders of :class:`~stackforge.core.records.ResultRecord` files, written
atomically as each probe or bench finishes, read back (strictly or leniently) and merged across shards.
"""
