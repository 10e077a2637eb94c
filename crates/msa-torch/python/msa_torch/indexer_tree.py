"""MSA's tree indexer (``msa_v1.indexer_tree``) is not implemented by msa-rs: every entry point
raises ``NotImplementedError``. The module exists so ``msa_torch`` has ``msa_v1``'s modules."""

from __future__ import annotations

__all__ = ["compile_plan", "forward"]

_MESSAGE = (
    "msa_torch.indexer_tree.{}: the tree indexer (msa_v1.indexer_tree, batch-1 interval "
    "visibility plans) is not implemented by msa-rs; use msa_torch.indexer.forward"
)


def compile_plan(*args, **kwargs):
    """Not implemented: raises ``NotImplementedError``."""
    raise NotImplementedError(_MESSAGE.format("compile_plan"))


def forward(*args, **kwargs):
    """Not implemented: raises ``NotImplementedError``."""
    raise NotImplementedError(_MESSAGE.format("forward"))
