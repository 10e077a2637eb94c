"""Loading the compiled extension ``msa_torch._C``.

The package imports without it (a source checkout, a wheel for another platform): every call
that needs the kernels then raises :class:`ExtensionUnavailableError` saying why, and
:func:`msa_torch.unavailable_reason` reports it without raising.
"""

from __future__ import annotations

try:
    from . import _C  # type: ignore[attr-defined]

    IMPORT_ERROR: BaseException | None = None
except ImportError as e:  # pragma: no cover - exercised only without the built extension
    _C = None
    IMPORT_ERROR = e


class ExtensionUnavailableError(RuntimeError):
    """The compiled extension ``msa_torch._C`` is not importable."""


def extension_missing_reason() -> str | None:
    """Why ``msa_torch._C`` is not loaded, or ``None`` when it is."""
    if _C is not None:
        return None
    return (
        f"the compiled extension msa_torch._C could not be imported ({IMPORT_ERROR}); install "
        "the msa-torch wheel built by `cargo xtask wheel` (pip install "
        "target/wheels/msa_torch-*.whl)"
    )


def ext():
    """The extension module, or :class:`ExtensionUnavailableError`."""
    if _C is None:
        raise ExtensionUnavailableError(extension_missing_reason())
    return _C


if _C is not None:
    TopKError = _C.TopKError
else:  # pragma: no cover

    class TopKError(ValueError):  # type: ignore[no-redef]
        """An invalid top-k entry found by prepare's validation (``code``, ``reason``,
        ``head``, ``query``, ``slot``)."""
