"""memslice: GPU memory slicing for Kubernetes."""

__version__ = "0.1.0"
