"""Recommenders for (user, item) -> rating: biased matrix factorisation and a small neural CF."""

from __future__ import annotations

import torch
from torch import nn


class BiasedMF(nn.Module):
    """rating = global mean + user bias + item bias + <user factors, item factors>.

    Dropout on the factors regularises every row equally, whatever the optimizer (an L2 penalty
    through Adam would shrink rarely seen rows far harder than frequent ones).
    """

    def __init__(self, num_users: int, num_items: int, dim: int = 32, global_mean: float = 3.5,
                 dropout: float = 0.5) -> None:
        super().__init__()
        self.user_factors = nn.Embedding(num_users, dim)
        self.item_factors = nn.Embedding(num_items, dim)
        self.user_bias = nn.Embedding(num_users, 1)
        self.item_bias = nn.Embedding(num_items, 1)
        self.global_bias = nn.Parameter(torch.tensor(float(global_mean)))
        self.dropout = nn.Dropout(dropout)
        # small factors: the prediction starts near the biases and grows only where the data says so
        nn.init.normal_(self.user_factors.weight, std=0.01)
        nn.init.normal_(self.item_factors.weight, std=0.01)
        nn.init.zeros_(self.user_bias.weight)
        nn.init.zeros_(self.item_bias.weight)

    def forward(self, user: torch.Tensor, item: torch.Tensor) -> torch.Tensor:
        p = self.dropout(self.user_factors(user))
        q = self.dropout(self.item_factors(item))
        dot = (p * q).sum(-1)
        return self.global_bias + self.user_bias(user).squeeze(-1) + self.item_bias(item).squeeze(-1) + dot


class NeuralCF(nn.Module):
    """Biases plus an MLP over the concatenated user and item embeddings."""

    def __init__(self, num_users: int, num_items: int, dim: int = 32, hidden: int = 64,
                 global_mean: float = 3.5, dropout: float = 0.2) -> None:
        super().__init__()
        self.user_embedding = nn.Embedding(num_users, dim)
        self.item_embedding = nn.Embedding(num_items, dim)
        self.user_bias = nn.Embedding(num_users, 1)
        self.item_bias = nn.Embedding(num_items, 1)
        self.global_bias = nn.Parameter(torch.tensor(float(global_mean)))
        self.mlp = nn.Sequential(nn.Dropout(dropout), nn.Linear(2 * dim, hidden), nn.ReLU(),
                                 nn.Dropout(dropout), nn.Linear(hidden, 1))
        nn.init.normal_(self.user_embedding.weight, std=0.01)
        nn.init.normal_(self.item_embedding.weight, std=0.01)
        nn.init.zeros_(self.user_bias.weight)
        nn.init.zeros_(self.item_bias.weight)

    def forward(self, user: torch.Tensor, item: torch.Tensor) -> torch.Tensor:
        x = torch.cat([self.user_embedding(user), self.item_embedding(item)], dim=-1)
        biases = self.user_bias(user).squeeze(-1) + self.item_bias(item).squeeze(-1)
        return self.global_bias + biases + self.mlp(x).squeeze(-1)
