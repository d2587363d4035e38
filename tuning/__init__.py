"""alt_tvm.tuning (see DESIGN.md §1)."""
