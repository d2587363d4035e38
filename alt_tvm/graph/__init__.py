"""alt_tvm.graph: a model through alt-tvm's strategies to a compiled module (see ARCHITECTURE.md).

``frontend`` (import), ``prepare`` and ``canonical`` (one graph whatever the frontend),
``partition`` (the partitions and their strategies), ``propagate`` (the pass: partitions
lowered, layouts carried between them), ``lower`` (TVM's legalization for the rest,
scheduled), ``build`` (``alt_tvm.build`` and ``alt_tvm.pipeline``), ``report`` (what a
build did), ``compiled`` (the built model).
"""
