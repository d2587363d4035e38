"""BERT-tiny (Turc et al.'s ``bert_uncased_L-2_H-128_A-2`` shape) in plain PyTorch.

Two encoder layers, hidden size 128, 2 attention heads of 64, feed-forward width 512, exact
(erf) GELU, post-LayerNorm (eps 1e-12), vocabulary 30522, 512 positions, 2 token types.
The input is ``input_ids`` (int64, ``batch x seq``) and optionally ``attention_mask`` (int64,
1 = attend, 0 = padding, turned into an additive ``-10000`` bias as in the original BERT);
the output is the last hidden state ``batch x seq x 128`` (no pooler).

Export-friendliness: position and token-type embeddings are static slices of their tables
(token type 0 for every token), head splitting uses ``unflatten``/``flatten`` rather than
shapes read at run time, and the only branch (mask or not) is decided by the Python call.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ._init import check_positive, init_weights, seeded_generator

__all__ = ["BertConfig", "BertTiny", "bert_tiny"]


class BertConfig:
    """Sizes of BERT-tiny; the defaults are the published ones."""

    def __init__(self, *, vocab_size: int = 30522, hidden: int = 128, layers: int = 2, heads: int = 2,
                 intermediate: int = 512, max_positions: int = 512, type_vocab: int = 2,
                 eps: float = 1e-12) -> None:
        if hidden % heads:
            raise ValueError(f"hidden ({hidden}) must be a multiple of heads ({heads})")
        self.vocab_size, self.hidden, self.layers, self.heads = vocab_size, hidden, layers, heads
        self.intermediate, self.max_positions, self.type_vocab, self.eps = intermediate, max_positions, type_vocab, eps


class _SelfAttention(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.head_dim = cfg.hidden // cfg.heads
        self.query = nn.Linear(cfg.hidden, cfg.hidden)
        self.key = nn.Linear(cfg.hidden, cfg.hidden)
        self.value = nn.Linear(cfg.hidden, cfg.hidden)
        self.output = nn.Linear(cfg.hidden, cfg.hidden)
        self.norm = nn.LayerNorm(cfg.hidden, eps=cfg.eps)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        # batch x seq x hidden -> batch x heads x seq x head_dim
        return x.unflatten(-1, (self.heads, self.head_dim)).transpose(1, 2)

    def forward(self, x: torch.Tensor, mask_bias: torch.Tensor | None) -> torch.Tensor:
        q, k, v = self._split(self.query(x)), self._split(self.key(x)), self._split(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        if mask_bias is not None:
            scores = scores + mask_bias
        context = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2).flatten(2)
        return self.norm(x + self.output(context))


class _EncoderLayer(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.attention = _SelfAttention(cfg)
        self.intermediate = nn.Linear(cfg.hidden, cfg.intermediate)
        self.gelu = nn.GELU()  # exact erf form, as in BERT
        self.output = nn.Linear(cfg.intermediate, cfg.hidden)
        self.norm = nn.LayerNorm(cfg.hidden, eps=cfg.eps)

    def forward(self, x: torch.Tensor, mask_bias: torch.Tensor | None) -> torch.Tensor:
        x = self.attention(x, mask_bias)
        return self.norm(x + self.output(self.gelu(self.intermediate(x))))


class BertTiny(nn.Module):
    """BERT encoder returning the last hidden state."""

    def __init__(self, cfg: BertConfig | None = None) -> None:
        super().__init__()
        cfg = cfg or BertConfig()
        self.cfg = cfg
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.position_embeddings = nn.Embedding(cfg.max_positions, cfg.hidden)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab, cfg.hidden)
        self.embedding_norm = nn.LayerNorm(cfg.hidden, eps=cfg.eps)
        self.layers = nn.ModuleList(_EncoderLayer(cfg) for _ in range(cfg.layers))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        seq = input_ids.shape[1]
        x = (self.word_embeddings(input_ids) + self.position_embeddings.weight[:seq]
             + self.token_type_embeddings.weight[0])
        x = self.embedding_norm(x)
        mask_bias = None
        if attention_mask is not None:
            # batch x seq (1 = keep) -> batch x 1 x 1 x seq additive bias
            mask_bias = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
        for layer in self.layers:
            x = layer(x, mask_bias)
        return x


def bert_tiny(*, batch: int = 1, seed: int = 0, seq_len: int = 128, vocab_size: int = 30522,
              with_mask: bool = True) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """BERT-tiny in eval mode with seeded weights, and example ``input_ids`` (and ``attention_mask``).

    Parameters
    ----------
    batch : int
        Batch size of the example inputs.
    seed : int
        Seed of the weights and of the example token ids.
    seq_len : int
        Sequence length (128 by default; at most 512, the number of position embeddings).
    vocab_size : int
        Vocabulary size (30522 in BERT; smaller values shrink the embedding table only).
    with_mask : bool
        Whether the example inputs include an ``attention_mask`` (whose tail is padding: each
        sample ``i`` masks its last ``(i + 1) * seq_len // 8`` tokens, capped at half).

    Returns
    -------
    tuple
        ``(module, (input_ids,))`` or ``(module, (input_ids, attention_mask))``.
    """
    check_positive("batch", batch)
    cfg = BertConfig(vocab_size=check_positive("vocab_size", vocab_size))
    if not 1 <= check_positive("seq_len", seq_len) <= cfg.max_positions:
        raise ValueError(f"seq_len must be in [1, {cfg.max_positions}], got {seq_len}")
    gen = seeded_generator(seed)
    model = BertTiny(cfg)
    init_weights(model, gen)
    model.eval()
    input_ids = torch.randint(0, cfg.vocab_size, (batch, seq_len), generator=gen, dtype=torch.int64)
    if not with_mask:
        return model, (input_ids,)
    mask = torch.ones(batch, seq_len, dtype=torch.int64)
    for i in range(batch):
        padding = min((i + 1) * seq_len // 8, seq_len // 2)
        if padding:
            mask[i, seq_len - padding:] = 0
    return model, (input_ids, mask)
