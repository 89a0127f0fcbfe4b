"""Placeholder for the metadata wheel readers (the module that replaces it exports its ReaderSpecs)."""

READERS: tuple = ()
