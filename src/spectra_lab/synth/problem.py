"""Matrix logistic regression, the test problem of the paper's synthetic experiments.

"Enhancing LLM Training via Spectral Clipping", Appendix "Synthetic experiments":

    f(X) = (1/n) Σᵢ log(1 + exp(−yᵢ ⟨Aᵢ, X⟩)),
    ∇f(X) = (1/n) Σᵢ −yᵢ / (1 + exp(yᵢ ⟨Aᵢ, X⟩)) · Aᵢ,

with ``‖∇f(X)‖₂ ≤ M ≤ (1/n) Σᵢ ‖Aᵢ‖₂`` and ``L_F ≤ σ_max(Ã)²/(4n)``, where the rows of
``Ã`` are ``vec(Aᵢ)ᵀ``. Everything is float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

DTYPE = torch.float64


@dataclass(frozen=True)
class LogisticProblem:
    """Logistic loss over data matrices ``Aᵢ`` (stored flattened as the rows of ``A``).

    Every method is batched over the leading dimensions of ``X`` (shape ``(..., m, p)``).
    """

    A: Tensor  # (n, m·p): row i is vec(Aᵢ)
    y: Tensor  # (n,): labels in {−1, +1}
    shape: tuple[int, int]  # (m, p), the shape of X

    @property
    def n(self) -> int:
        return self.A.shape[0]

    def margins(self, X: Tensor, idx: Tensor | None = None) -> Tensor:
        """``yᵢ ⟨Aᵢ, X⟩`` for the samples ``idx`` (all by default), shape ``(..., |idx|)``."""
        A, y = (self.A, self.y) if idx is None else (self.A[idx], self.y[idx])
        return (X.reshape(*X.shape[:-2], -1) @ A.mT) * y

    def loss(self, X: Tensor, idx: Tensor | None = None) -> Tensor:
        """``f(X)`` on the samples ``idx`` (all by default), shape ``X.shape[:-2]``."""
        return F.softplus(-self.margins(X, idx)).mean(-1)

    def loss_and_grad(self, X: Tensor, idx: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``(f(X), ∇f(X))`` on the samples ``idx``; with ``idx`` this is the minibatch gradient."""
        A, y = (self.A, self.y) if idx is None else (self.A[idx], self.y[idx])
        z = (X.reshape(*X.shape[:-2], -1) @ A.mT) * y
        coef = -y * torch.sigmoid(-z) / A.shape[0]
        grad = (coef @ A).reshape(X.shape)
        return F.softplus(-z).mean(-1), grad

    def smoothness(self) -> float:
        """The bound ``L_F ≤ σ_max(Ã)²/(4n)`` on the Lipschitz constant of ∇f (Frobenius)."""
        return float(torch.linalg.matrix_norm(self.A, ord=2) ** 2 / (4 * self.n))

    def gradient_bound(self) -> float:
        """The bound ``M ≤ (1/n) Σᵢ ‖Aᵢ‖₂`` on the spectral norm of ∇f."""
        mats = self.A.reshape(self.n, *self.shape)
        return float(torch.linalg.matrix_norm(mats, ord=2).mean())


@dataclass(frozen=True)
class LogisticData:
    """A train/test split drawn from one planted matrix ``X̃``."""

    train: LogisticProblem
    test: LogisticProblem
    planted: Tensor


def make_logistic_data(
    d: int, n_train: int, n_test: int, noise_std: float, seed: int
) -> LogisticData:
    """Draw the paper's data: ``X̃, Aᵢ`` with i.i.d. N(0, 1) entries (d × d) and labels
    ``yᵢ = sign(⟨Aᵢ, X̃⟩ + ξᵢ)``, ``ξᵢ ~ N(0, noise_std²)``.
    """
    if d < 1 or n_train < 1 or n_test < 0:
        raise ValueError(f"need d >= 1, n_train >= 1, n_test >= 0; got {d}, {n_train}, {n_test}")
    if not noise_std >= 0:
        raise ValueError(f"noise_std must be >= 0, got {noise_std!r}")
    gen = torch.Generator().manual_seed(seed)
    planted = torch.randn(d, d, generator=gen, dtype=DTYPE)
    n = n_train + n_test
    A = torch.randn(n, d * d, generator=gen, dtype=DTYPE)
    xi = noise_std * torch.randn(n, generator=gen, dtype=DTYPE)
    y = torch.sign(A @ planted.reshape(-1) + xi)
    y[y == 0] = 1.0
    shape = (d, d)
    return LogisticData(
        train=LogisticProblem(A[:n_train], y[:n_train], shape),
        test=LogisticProblem(A[n_train:], y[n_train:], shape),
        planted=planted,
    )
