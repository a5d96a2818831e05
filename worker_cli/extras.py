"""How to install an optional extra, said the same way by every message that
needs one. The package is not published on PyPI under this name yet, so each
hint names the checkout form too."""

from __future__ import annotations

__all__ = ["install_hint"]


def install_hint(extra: str) -> str:
    """``pip install 'graphile-worker[EXTRA]'`` and its form in a checkout of
    the repository (``pip install '.[EXTRA]'``)."""
    return (
        f"install the {extra} extra: pip install 'graphile-worker[{extra}]' "
        f"(or pip install '.[{extra}]' in a checkout of the repository)"
    )
