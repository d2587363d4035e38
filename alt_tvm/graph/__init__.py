"""alt_tvm.graph: Relax import, partitioning and the strategy registry (see DESIGN.md §1)."""
