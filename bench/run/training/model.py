"""The model a training run trains: a small GPT-like transformer with AdamW on a seeded token
stream, and a deep copy of its state for verification."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from bench.config.training import ModelConfig, TrainingConfig


class TinyGPT(nn.Module):
    """Token + position embeddings, `n_layers` pre-norm encoder layers under a causal mask, a
    final norm and an untied output head: the state_dict of a real (small) language model."""

    def __init__(self, m: ModelConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(m.vocab, m.d_model)
        self.pos = nn.Embedding(m.seq_len, m.d_model)
        layer = nn.TransformerEncoderLayer(
            m.d_model, m.n_heads, m.d_ff, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, m.n_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(m.d_model)
        self.head = nn.Linear(m.d_model, m.vocab, bias=False)
        self.mask: torch.Tensor
        self.register_buffer(
            "mask", nn.Transformer.generate_square_subsequent_mask(m.seq_len), persistent=False
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        h = self.tok(x) + self.pos.weight[:n]
        h = self.blocks(h, mask=self.mask[:n, :n], is_causal=True)
        return self.head(self.norm(h))


@dataclass
class Trainer:
    """Model, optimizer and a seeded token stream; `step()` is one training step."""

    cfg: TrainingConfig
    device: torch.device

    def __post_init__(self) -> None:
        torch.manual_seed(self.cfg.seed)
        self.model = TinyGPT(self.cfg.model).to(self.device)
        self.opt = torch.optim.AdamW(
            self.model.parameters(), lr=self.cfg.lr, weight_decay=self.cfg.weight_decay
        )
        self.gen = torch.Generator().manual_seed(self.cfg.seed + 1)

    def batch(self) -> torch.Tensor:
        m = self.cfg.model
        x = torch.randint(0, m.vocab, (m.batch_size, m.seq_len + 1), generator=self.gen)
        return x.to(self.device)

    def step(self) -> float:
        """Forward, backward, optimizer step; returns the loss."""
        x = self.batch()
        logits = self.model(x[:, :-1])
        loss = nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1)
        )
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return float(loss.detach())  # waits for the device, like a training loop's logging

    def state(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optim": self.opt.state_dict()}

    def load_state(self, state: dict[str, Any]) -> None:
        """Model and optimizer from a restored `state()` (load_state_dict). An engine that gives
        keys back as strings (dcp: its `loose_keys`) gives the optimizer's parameter indices so;
        they are made ints again, else AdamW would keep that state beside its parameters and
        start them afresh."""
        optim = dict(state["optim"])
        optim["state"] = {
            int(k) if isinstance(k, str) and k.isdigit() else k: v
            for k, v in optim["state"].items()
        }
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(optim)

    def init_optimizer_state(self) -> None:
        """Make AdamW's per-parameter state (its step and moments) before a restart's load, as
        a relaunched job's checkpointer does (torchtitan, DCP's `get_state_dict`): one step
        with zero gradients at learning rate 0, which leaves the parameters as they are. Its
        values are the load's to replace; its tensors are where the load puts them."""
        lrs = [g["lr"] for g in self.opt.param_groups]
        for g in self.opt.param_groups:
            g["lr"] = 0.0
        for p in self.model.parameters():
            p.grad = torch.zeros_like(p)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        for g, lr in zip(self.opt.param_groups, lrs, strict=True):
            g["lr"] = lr

    def lose(self) -> None:
        """A failure: the model and optimizer gone, their memory freed."""
        del self.model, self.opt


def clone_state(state: Any) -> Any:
    """A deep copy whose tensors no longer share memory with the model or optimizer."""
    return copy.deepcopy(state)
