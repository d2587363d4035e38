"""alt_tvm.vta_mapping (see DESIGN.md §1)."""
