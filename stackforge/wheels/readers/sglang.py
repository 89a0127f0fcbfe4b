"""Placeholder for the sglang wheel readers (the module that replaces it exports its ReaderSpecs)."""

READERS: tuple = ()
