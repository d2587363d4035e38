"""Matrix products: dense (``torch.nn.Linear`` convention), matmul and batch matmul."""

from __future__ import annotations

from tvm import te

from ._utils import (
    check_tensor,
    dtype_of,
    index_dtype,
    index_shape,
    reduce_axis,
    shape_of,
)

__all__ = ["batch_matmul", "dense", "matmul"]


def _check_rank(t: te.Tensor, rank: int, what: str, layout: str) -> tuple:
    check_tensor(t, what)
    if len(t.shape) != rank:
        raise ValueError(f"{what} must have rank {rank} ({layout}), got shape {list(t.shape)}")
    return shape_of(t)


def _check_same(a, b, what: str) -> None:
    # Sizes may be symbolic; only compare when both are constants.
    if isinstance(a, int) and isinstance(b, int) and a != b:
        raise ValueError(f"{what}: {a} != {b}")


def _out_dtype(a: te.Tensor, b: te.Tensor, names: str, out_dtype: str | None) -> str:
    """Check both operands share a dtype; return ``out_dtype`` or that dtype."""
    if dtype_of(a) != dtype_of(b):
        raise ValueError(f"{names} must have the same dtype, got {dtype_of(a)} and {dtype_of(b)}")
    return out_dtype or dtype_of(a)


def _mul(x, y, out_dtype: str):
    if dtype_of(x) != out_dtype:
        x = x.astype(out_dtype)
        y = y.astype(out_dtype)
    return x * y


def dense(data: te.Tensor, weight: te.Tensor, *, out_dtype: str | None = None, name: str = "dense") -> te.Tensor:
    """Fully connected layer without bias: ``out[b, n] = sum_k data[b, k] * weight[n, k]``.

    Parameters
    ----------
    data : te.Tensor
        ``[B, K]``.
    weight : te.Tensor
        ``[N, K]`` (``torch.nn.Linear.weight`` layout).
    out_dtype : str, optional
        Accumulation and output dtype; defaults to the dtype of ``data``.
    name : str, optional
        Name of the compute stage.

    Returns
    -------
    te.Tensor
        ``[B, N]``, tagged ``"dense"``.

    Raises
    ------
    ValueError
        On ranks other than 2, mismatched ``K`` or mismatched dtypes.
    """
    batch, k_in = _check_rank(data, 2, "data", "B, K")
    n_out, k_w = _check_rank(weight, 2, "weight", "N, K")
    _check_same(k_in, k_w, "dense reduction sizes differ (data dim 1 vs weight dim 1)")
    out_dtype = _out_dtype(data, weight, "data and weight", out_dtype)
    idx = index_dtype(data)
    k = reduce_axis(k_in, "k", idx)
    return te.compute(
        index_shape((batch, n_out), idx),
        lambda i, j: te.sum(_mul(data(i, k), weight(j, k), out_dtype), axis=k),
        name=name,
        tag="dense",
        attrs={"out_dtype": out_dtype},
    )


def matmul(a: te.Tensor, b: te.Tensor, *, out_dtype: str | None = None, name: str = "matmul") -> te.Tensor:
    """Matrix product ``out[m, n] = sum_k a[m, k] * b[k, n]``.

    Parameters
    ----------
    a : te.Tensor
        ``[M, K]``.
    b : te.Tensor
        ``[K, N]``.
    out_dtype : str, optional
        Accumulation and output dtype; defaults to the dtype of ``a``.
    name : str, optional
        Name of the compute stage.

    Returns
    -------
    te.Tensor
        ``[M, N]``, tagged ``"matmul"``.

    Raises
    ------
    ValueError
        On ranks other than 2, mismatched ``K`` or mismatched dtypes.
    """
    m, k_a = _check_rank(a, 2, "a", "M, K")
    k_b, n = _check_rank(b, 2, "b", "K, N")
    _check_same(k_a, k_b, "matmul reduction sizes differ (a dim 1 vs b dim 0)")
    out_dtype = _out_dtype(a, b, "a and b", out_dtype)
    idx = index_dtype(a)
    k = reduce_axis(k_a, "k", idx)
    return te.compute(
        index_shape((m, n), idx),
        lambda i, j: te.sum(_mul(a(i, k), b(k, j), out_dtype), axis=k),
        name=name,
        tag="matmul",
        attrs={"out_dtype": out_dtype},
    )


def batch_matmul(
    a: te.Tensor,
    b: te.Tensor,
    *,
    transpose_b: bool = False,
    out_dtype: str | None = None,
    name: str = "batch_matmul",
) -> te.Tensor:
    """Batched matrix product ``out[z, m, n] = sum_k a[z, m, k] * b[z, k, n]``.

    Parameters
    ----------
    a : te.Tensor
        ``[Z, M, K]``.
    b : te.Tensor
        ``[Z, K, N]``, or ``[Z, N, K]`` with ``transpose_b=True``.
    transpose_b : bool, optional
        Read ``b`` as ``[Z, N, K]``.
    out_dtype : str, optional
        Accumulation and output dtype; defaults to the dtype of ``a``.
    name : str, optional
        Name of the compute stage.

    Returns
    -------
    te.Tensor
        ``[Z, M, N]``, tagged ``"batch_matmul"``, attrs ``transpose_b``.

    Raises
    ------
    ValueError
        On ranks other than 3, mismatched batch or ``K`` sizes, or mismatched dtypes.
    """
    z_a, m, k_a = _check_rank(a, 3, "a", "Z, M, K")
    if transpose_b:
        z_b, n, k_b = _check_rank(b, 3, "b", "Z, N, K with transpose_b=True")
    else:
        z_b, k_b, n = _check_rank(b, 3, "b", "Z, K, N")
    _check_same(z_a, z_b, "batch_matmul batch sizes differ (a dim 0 vs b dim 0)")
    _check_same(
        k_a,
        k_b,
        f"batch_matmul reduction sizes differ (a dim 2 vs b dim {2 if transpose_b else 1})",
    )
    out_dtype = _out_dtype(a, b, "a and b", out_dtype)
    idx = index_dtype(a)
    k = reduce_axis(k_a, "k", idx)
    if transpose_b:

        def body(z, i, j):
            return te.sum(_mul(a(z, i, k), b(z, j, k), out_dtype), axis=k)
    else:

        def body(z, i, j):
            return te.sum(_mul(a(z, i, k), b(z, k, j), out_dtype), axis=k)

    return te.compute(
        index_shape((z_a, m, n), idx),
        body,
        name=name,
        tag="batch_matmul",
        attrs={"transpose_b": bool(transpose_b), "out_dtype": out_dtype},
    )
