"""kdagen's version, in a module of its own: generated headers and cache keys read it
without importing the package's ops."""
__version__ = "0.1.0"
