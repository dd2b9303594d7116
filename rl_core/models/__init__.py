"""Model and tokenizer loading (Hugging Face format) and the built-in tiny models.

Attributes are imported on first use, so `import rl_core.models` (and the CLI, which only needs
the tiny presets) does not pull in torch and transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "ModelLoadError": "loading",
    "check_model_folder": "loading",
    "check_tokenizer_folder": "loading",
    "load_from_spec": "loading",
    "load_model": "loading",
    "load_model_and_tokenizer": "loading",
    "load_tokenizer": "loading",
    "resolve_dtype": "loading",
    "resolve_model_path": "loading",
    "TINY_SIZES": "presets",
    "TinySize": "presets",
    "parse_tiny_path": "presets",
    "build_tiny": "tiny",
    "count_parameters": "tiny",
    "resolve_tiny": "tiny",
    "save_tiny": "tiny",
    "tiny_cache_root": "tiny",
    "tiny_config": "tiny",
    "write_tiny": "tiny",
    "build_tiny_tokenizer": "tokenizer",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from rl_core.models.loading import (
        ModelLoadError,
        check_model_folder,
        check_tokenizer_folder,
        load_from_spec,
        load_model,
        load_model_and_tokenizer,
        load_tokenizer,
        resolve_dtype,
        resolve_model_path,
    )
    from rl_core.models.presets import TINY_SIZES, TinySize, parse_tiny_path
    from rl_core.models.tiny import (
        build_tiny,
        count_parameters,
        resolve_tiny,
        save_tiny,
        tiny_cache_root,
        tiny_config,
        write_tiny,
    )
    from rl_core.models.tokenizer import build_tiny_tokenizer


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
