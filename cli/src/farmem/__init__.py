"""farmem: run unmodified programs with most of their memory in a remote memory server."""

from farmem.errors import FarmemError

__version__ = "0.1.0"
__all__ = ["FarmemError", "__version__"]
