"""alt_tvm.strategies (see DESIGN.md §1)."""
