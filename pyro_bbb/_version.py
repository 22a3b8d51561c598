"""The package version (read by ``setup.cfg`` and written into checkpoints)."""

__version__ = "0.1.0"
