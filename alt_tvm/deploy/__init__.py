"""alt_tvm.deploy: compiled models that run, here or on a board, without the build code.

``model.py`` runs a compiled model (inputs checked, timed, profiled), ``artifact.py``
writes and loads artifacts, ``remote.py`` runs one on a board through an RPC tracker.
Nothing here imports a strategy or the graph package: loading compiles nothing.
"""
