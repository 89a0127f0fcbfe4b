"""stackforge: compose, build, probe and benchmark GPU serving stacks; emit a compatibility matrix."""

__version__ = "0.1.0"
