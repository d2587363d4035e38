"""alt_tvm.vta_mapping (see ARCHITECTURE.md)."""
