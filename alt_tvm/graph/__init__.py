"""alt_tvm.graph: Relax import, partitioning and the strategy registry (see ARCHITECTURE.md)."""
