"""PyTorch eager as a peer: a module in inference mode on a fixed intra-op thread count."""

from __future__ import annotations

from typing import Any

import numpy as np

from alt_tvm.deploy.model import flatten_outputs

from .base import check_threads

__all__ = ["TorchRunner", "torch_runner"]


class TorchRunner:
    """A PyTorch module run in inference mode with a fixed intra-op thread count.

    ``torch.set_num_threads`` is process-wide: the runner sets it before each call if another
    piece of code changed it.
    """

    name = "pytorch"

    def __init__(self, module: Any, threads: int) -> None:
        self.module = module
        self.threads = threads

    def __call__(self, *args: np.ndarray) -> list[np.ndarray]:
        import torch

        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        with torch.inference_mode():
            # np.asarray keeps a 0-d input 0-d (np.ascontiguousarray makes it shape (1,))
            return flatten_outputs(self.module(*(torch.from_numpy(np.asarray(a, order="C")) for a in args)))


def torch_runner(module: Any, *, threads: int = 1) -> TorchRunner:
    """A runner for ``module`` (put in eval mode) using ``threads`` intra-op threads.

    Parameters
    ----------
    module : torch.nn.Module
    threads : int

    Returns
    -------
    TorchRunner

    Raises
    ------
    TypeError
        If ``module`` is not a ``torch.nn.Module``.
    ValueError
        If ``threads`` is not an int >= 1.
    """
    import torch

    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    return TorchRunner(module.eval(), check_threads(threads))
