"""Opt-in alias ``msa_v1`` → ``msa_torch`` for code written against MSA's package.

``install_msa_v1_alias()`` registers ``msa_torch`` and its modules (``attention``, ``indexer``,
``indexer_tree``, ``kl``) under the names ``msa_v1`` and ``msa_v1.<module>`` in
``sys.modules``, so ``from msa_v1 import attention`` then runs msa-rs. It never shadows a real
``msa_v1``: if one is imported or importable it returns ``False`` and changes nothing.
"""

from __future__ import annotations

import importlib.util
import sys

_MODULES = ("attention", "indexer", "indexer_tree", "kl")


def install_msa_v1_alias() -> bool:
    """Alias ``msa_v1`` to ``msa_torch``; ``True`` if the alias is (now) in place, ``False`` if
    a real ``msa_v1`` exists (then nothing is changed)."""
    import msa_torch

    existing = sys.modules.get("msa_v1")
    if existing is msa_torch:
        return True
    if existing is not None:
        return False
    try:
        spec = importlib.util.find_spec("msa_v1")
    except (ImportError, ValueError):
        spec = None
    if spec is not None:
        return False
    sys.modules["msa_v1"] = msa_torch
    for name in _MODULES:
        sys.modules[f"msa_v1.{name}"] = getattr(msa_torch, name)
    return True


def uninstall_msa_v1_alias() -> None:
    """Remove an alias :func:`install_msa_v1_alias` made (a real ``msa_v1`` is left alone)."""
    import msa_torch

    if sys.modules.get("msa_v1") is msa_torch:
        del sys.modules["msa_v1"]
        for name in _MODULES:
            sys.modules.pop(f"msa_v1.{name}", None)
