"""The C side of memslice: the LD_PRELOAD shim, the region library, and the simulated GPU.

Sources live next to this file (src/, sim/, include/); `make -C interposer` builds them into build/.
"""
