"""Datasets, prompt templates, batching with a resumable cursor and synthetic tasks.

Importing the package is cheap: no torch, and pyarrow only when a parquet file is read or written.
"""

from rl_core.data.datasets import (
    SUPPORTED_SUFFIXES,
    DataError,
    PairRecord,
    PromptRecord,
    get_field,
    load_pair_files,
    load_pairs,
    load_prompt_files,
    load_prompts,
    read_rows,
    write_rows,
)
from rl_core.data.loader import ResumableLoader, epoch_order
from rl_core.data.run_data import data_files, load_pair_data, load_prompt_data
from rl_core.data.synthetic import (
    FORMATS,
    TASKS,
    arithmetic_problems,
    countdown_problems,
    generate,
    materialize_synthetic,
    synthetic_splits,
    verify_countdown,
    write_synthetic,
)
from rl_core.data.templates import (
    CHAT,
    TEMPLATES,
    RenderedPrompt,
    check_template,
    render_prompt,
    render_prompts,
    template_names,
)

__all__ = [
    "CHAT",
    "FORMATS",
    "SUPPORTED_SUFFIXES",
    "TASKS",
    "TEMPLATES",
    "DataError",
    "PairRecord",
    "PromptRecord",
    "RenderedPrompt",
    "ResumableLoader",
    "arithmetic_problems",
    "check_template",
    "countdown_problems",
    "data_files",
    "epoch_order",
    "generate",
    "get_field",
    "load_pair_data",
    "load_pair_files",
    "load_pairs",
    "load_prompt_data",
    "load_prompt_files",
    "load_prompts",
    "materialize_synthetic",
    "read_rows",
    "render_prompt",
    "render_prompts",
    "synthetic_splits",
    "template_names",
    "verify_countdown",
    "write_rows",
    "write_synthetic",
]
