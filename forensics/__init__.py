"""forensics: crash forensics for native-heap failures in Python processes.

The small public Python API; the CLI (``forensics``) is built on it.
"""
__version__ = "0.1.0"

__all__ = ["__version__", "analyze_core", "open_core"]


def __getattr__(name: str):  # import lazily: `forensics --help` should not load gdb plumbing
    if name == "analyze_core":
        from .analyze import analyze_core

        return analyze_core
    if name == "open_core":
        from .core import open_core

        return open_core
    raise AttributeError(name)
