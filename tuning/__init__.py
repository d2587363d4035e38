"""alt_tvm.tuning (see ARCHITECTURE.md)."""
