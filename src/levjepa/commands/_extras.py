"""Optional packages a command needs, checked before it writes anything: one line naming the extra to install.

pyproject.toml's extras hold what a part of levjepa needs beyond the base install (``deploy``: the ONNX
exporter and runtime). A command that will need one checks it here first, so ``levjepa export --format onnx`` on
a plain install says ``pip install 'levjepa[deploy]'`` instead of a traceback after the weights are written.
"""

from __future__ import annotations

import importlib.util

from levjepa.config import ConfigError

__all__ = ["EXTRAS", "require_extra"]

# extra -> the importable packages it installs (pyproject.toml's [project.optional-dependencies])
EXTRAS: dict[str, tuple[str, ...]] = {"deploy": ("onnx", "onnxscript", "onnxruntime")}


def require_extra(extra: str, what: str, packages: tuple[str, ...] | None = None) -> None:
    """Refuse ``what`` (the option that needs them) in one line unless ``packages`` (default: all of ``extra``'s)
    import here."""
    missing = [m for m in packages or EXTRAS[extra] if importlib.util.find_spec(m) is None]
    if missing:
        verb = "is" if len(missing) == 1 else "are"
        raise ConfigError(
            f"{what} needs the {extra} extra, and {', '.join(missing)} {verb} not installed: "
            f"pip install 'levjepa[{extra}]'"
        )
