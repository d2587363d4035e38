"""Layout primitives, the TE rewrite pass and layout templates (ALT paper §4.1, §6)."""

from .layout import SCHEMA_VERSION, Layout
from .primitives import (
    DecoupleAt,
    Fold,
    Fuse,
    Pad,
    Primitive,
    Reorder,
    Split,
    StoreAt,
    Unfold,
    Unpad,
)
from .rewrite import RewriteResult, convert_layout, create_prim_func, rewrite

__all__ = [
    "SCHEMA_VERSION", "Layout", "Primitive", "Split", "Fuse", "Reorder", "Unfold", "Fold", "Pad",
    "Unpad", "StoreAt", "DecoupleAt", "RewriteResult", "rewrite", "create_prim_func", "convert_layout",
]
