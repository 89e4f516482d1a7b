"""The package version (one place: the package, the model files and the command line read it here)."""

__version__ = "0.1.0"
