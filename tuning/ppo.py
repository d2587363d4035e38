"""PPO actors and the shared critic of ALT's cross-exploration (paper §5.2).

* :class:`SplitActor` — the generic layout split actor: for every split knob a
  continuous action ``a in (0, 1)`` (a squashed Gaussian), decoded as ``F = R(D * a)``.
* :class:`DirectionActor` — a loop actor: for every loop knob a direction in
  {-1, 0, +1} of a random walk from the best point of a sampled batch.
* :class:`Critic` — one value network shared by all actors (it sees the joint state).

All randomness comes from a ``torch.Generator`` seeded by the caller, and networks are
initialised under a forked, seeded RNG, so a run is reproducible and leaves torch's
global RNG untouched.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

DIRECTIONS = (-1, 0, 1)


def _mlp(inputs: int, outputs: int, hidden: int = 64) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(inputs, hidden), torch.nn.Tanh(),
                               torch.nn.Linear(hidden, hidden), torch.nn.Tanh(),
                               torch.nn.Linear(hidden, outputs))


@dataclass(frozen=True)
class PPOConfig:
    """PPO hyper-parameters (the paper does not give its own; these are PPO's usual ones)."""

    clip: float = 0.2
    epochs: int = 4
    lr: float = 3e-3
    value_weight: float = 0.5
    entropy_weight: float = 0.01
    hidden: int = 64


class SplitActor(torch.nn.Module):
    def __init__(self, state_dim: int, knobs: int, hidden: int) -> None:
        super().__init__()
        self.mean = _mlp(state_dim, knobs, hidden)
        self.log_std = torch.nn.Parameter(torch.full((knobs,), -0.5))

    def distribution(self, state: torch.Tensor) -> torch.distributions.Normal:
        return torch.distributions.Normal(self.mean(state), self.log_std.exp())

    def sample(self, state: torch.Tensor, generator: torch.Generator) -> tuple[np.ndarray, torch.Tensor, float]:
        """Pre-squash sample ``u``, the actions ``a = sigmoid(u)`` in (0, 1), and log-prob."""
        with torch.no_grad():
            dist = self.distribution(state)
            noise = torch.randn(dist.mean.shape, generator=generator)
            u = dist.mean + dist.stddev * noise
            return torch.sigmoid(u).numpy(), u, float(dist.log_prob(u).sum())

    def log_prob(self, state: torch.Tensor, raw: torch.Tensor) -> torch.Tensor:
        return self.distribution(state).log_prob(raw).sum(-1)

    def entropy(self, state: torch.Tensor) -> torch.Tensor:
        return self.distribution(state).entropy().sum(-1)


class DirectionActor(torch.nn.Module):
    def __init__(self, state_dim: int, knobs: int, hidden: int) -> None:
        super().__init__()
        self.knobs = knobs
        self.logits = _mlp(state_dim, knobs * len(DIRECTIONS), hidden)

    def distribution(self, state: torch.Tensor) -> torch.distributions.Categorical:
        logits = self.logits(state).reshape(*state.shape[:-1], self.knobs, len(DIRECTIONS))
        return torch.distributions.Categorical(logits=logits)

    def sample(self, state: torch.Tensor, generator: torch.Generator, count: int) -> tuple[np.ndarray, np.ndarray]:
        """``count`` direction vectors (indices into DIRECTIONS) and their log-probs."""
        with torch.no_grad():
            dist = self.distribution(state)
            probs = dist.probs.reshape(self.knobs, len(DIRECTIONS))
            picks = torch.multinomial(probs, count, replacement=True, generator=generator).T  # count x knobs
            logp = dist.log_prob(picks).sum(-1)
            return picks.numpy(), logp.numpy()

    def log_prob(self, state: torch.Tensor, picks: torch.Tensor) -> torch.Tensor:
        return self.distribution(state).log_prob(picks).sum(-1)

    def entropy(self, state: torch.Tensor) -> torch.Tensor:
        return self.distribution(state).entropy().sum(-1)


class Critic(torch.nn.Module):
    def __init__(self, state_dim: int, hidden: int) -> None:
        super().__init__()
        self.value = _mlp(state_dim, 1, hidden)

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        return self.value(state).squeeze(-1)


class CrossExplorationAgents:
    """The layout actor, the loop actor and the shared critic of one task."""

    def __init__(self, *, layout_state: int, loop_state: int, layout_knobs: int, loop_knobs: int, seed: int,
                 config: PPOConfig | None = None) -> None:
        config = config or PPOConfig()
        self.config = config
        self.joint_dim = layout_state + loop_state
        self.layout_state_dim = layout_state
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.layout = SplitActor(self.joint_dim, layout_knobs, config.hidden)
            self.loop = DirectionActor(self.joint_dim, loop_knobs, config.hidden)
            self.critic = Critic(self.joint_dim, config.hidden)
        self.generator = torch.Generator().manual_seed(seed)
        params = list(self.layout.parameters()) + list(self.loop.parameters()) + list(self.critic.parameters())
        self.optimizer = torch.optim.Adam(params, lr=config.lr)

    def update(self, actor: torch.nn.Module, states: np.ndarray, actions: torch.Tensor, old_logp: np.ndarray,
               rewards: np.ndarray) -> float:
        """One PPO update (clipped surrogate + value loss) of ``actor`` and the critic."""
        if len(rewards) == 0:
            return 0.0
        s = torch.as_tensor(np.asarray(states, dtype=np.float32))
        r = torch.as_tensor(np.asarray(rewards, dtype=np.float32))
        old = torch.as_tensor(np.asarray(old_logp, dtype=np.float32))
        loss_value = 0.0
        for _ in range(self.config.epochs):
            value = self.critic(s)
            advantage = (r - value).detach()
            if len(advantage) > 1:
                advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-6)
            ratio = torch.exp(actor.log_prob(s, actions) - old)
            clipped = torch.clamp(ratio, 1 - self.config.clip, 1 + self.config.clip)
            policy = -torch.min(ratio * advantage, clipped * advantage).mean()
            loss = (policy + self.config.value_weight * torch.mean((value - r) ** 2)
                    - self.config.entropy_weight * actor.entropy(s).mean())
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            loss_value = loss.item()
        return loss_value
