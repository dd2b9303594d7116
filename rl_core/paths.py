"""Path policy of a cluster: which folders a run spec may read models and data from and write to.

A cluster admin lists allowed roots per kind of path (models, data, outputs) and whether model
code shipped in a model folder may run (`model.trust_remote_code`). `check_paths` is pure (the
standard library only, no torch, no Django), so the web process checks a submission with it and
the job checks its spec again before it reads anything, with `resolve=True` so that symbolic
links cannot lead out of a root.

Rules:
- empty roots for a kind mean no restriction for that kind;
- `tiny:<size>` model paths are built in and always allowed;
- a path is allowed when, normalized (`os.path.normpath`, plus `os.path.realpath` at the job),
  it is one of the roots or inside one;
- a relative path (also `~/...`) is refused where roots are set: the job's working directory is
  a temporary folder on the cluster, not the submitter's;
- `tools.profiling.output` and `tools.precision.output` are folders under `trainer.output_dir`
  and are checked joined to it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rl_core.models.registry import is_registry_uri

KINDS = ("model", "data", "output")
POLICY_ENV = "ASCENT_PATH_POLICY"

# Every path-like field of RunSpec and the kind of root it must lie under.
PATH_FIELDS: dict[str, str] = {
    "model.path": "model",
    "model.tokenizer_path": "model",
    "critic.model_path": "model",
    "reward.reward_model": "model",
    "data.train_files": "data",
    "data.val_files": "data",
    "trainer.output_dir": "output",
    "trainer.resume_path": "output",
    "tools.profiling.output": "output",
    "tools.precision.output": "output",
}
# Folders named relative to `trainer.output_dir`.
UNDER_OUTPUT_DIR = frozenset({"tools.profiling.output", "tools.precision.output"})
TRUST_FIELD = "model.trust_remote_code"


@dataclass(frozen=True)
class PathPolicy:
    """Allowed roots per kind (empty: unrestricted) of the cluster named `cluster`."""

    cluster: str = ""
    model_roots: tuple[str, ...] = ()
    data_roots: tuple[str, ...] = ()
    output_roots: tuple[str, ...] = ()
    allow_trust_remote_code: bool = True

    def roots(self, kind: str) -> tuple[str, ...]:
        return getattr(self, f"{kind}_roots")

    @property
    def unrestricted(self) -> bool:
        return self.allow_trust_remote_code and not any(self.roots(k) for k in KINDS)

    def to_json(self) -> str:
        return json.dumps({"cluster": self.cluster, "model_roots": list(self.model_roots),
                           "data_roots": list(self.data_roots),
                           "output_roots": list(self.output_roots),
                           "allow_trust_remote_code": self.allow_trust_remote_code})

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> PathPolicy:
        """From a dict such as `to_json` writes; roots are normalized, unknown keys ignored."""
        return cls(
            cluster=str(data.get("cluster", "")),
            **{f"{kind}_roots": tuple(normalize_root(r) for r in data.get(f"{kind}_roots") or ())
               for kind in KINDS},
            allow_trust_remote_code=bool(data.get("allow_trust_remote_code", True)),
        )

    @classmethod
    def from_json(cls, text: str) -> PathPolicy:
        """ValueError (naming the variable) for text that is not a JSON object."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{POLICY_ENV} is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{POLICY_ENV} must be a JSON object")
        return cls.from_mapping(data)


def root_problem(root: Any) -> str | None:
    """Why `root` cannot be an allowed root (absolute, no `..`), or None."""
    if not isinstance(root, str) or not root:
        return f"{root!r} is not a path"
    if not os.path.isabs(root):
        return f"{root} is not an absolute path: write it from / (e.g. /models)"
    if ".." in root.split("/"):
        return f"{root} contains '..': write the folder it means"
    return None


def normalize_root(root: str) -> str:
    """`/models/./a/` -> `/models/a`; ValueError for a root `root_problem` refuses."""
    problem = root_problem(root)
    if problem:
        raise ValueError(problem)
    return _normal(root)


def _normal(path: str) -> str:
    """os.path.normpath, with POSIX's leading `//` made one `/` too."""
    normal = os.path.normpath(path)
    return "/" + normal.lstrip("/") if normal.startswith("//") else normal


def is_inside(path: str, root: str) -> bool:
    """`path` is `root` or below it (both normalized absolute paths)."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def spec_paths(spec: Any) -> Iterator[tuple[str, str, str]]:
    """(field, kind, path) for every path the spec names; list items as `field.<index>`."""
    data = spec.model_dump(mode="json") if hasattr(spec, "model_dump") else spec
    output_dir = _get(data, "trainer.output_dir") or "outputs"
    for name, kind in PATH_FIELDS.items():
        value = _get(data, name)
        if name in UNDER_OUTPUT_DIR and isinstance(value, str):
            value = os.path.join(output_dir, value)
        if isinstance(value, str):
            yield name, kind, value
        elif isinstance(value, Sequence):
            yield from ((f"{name}.{i}", kind, item) for i, item in enumerate(value)
                        if isinstance(item, str))


def _get(data: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(data, Mapping):
            return None
        data = data.get(part)
    return data


def check_paths(spec: Any, policy: PathPolicy | Mapping[str, Any], *,
                resolve: bool = False) -> list[dict[str, str]]:
    """Every path of `spec` (a RunSpec or its mapping) outside `policy`, as {field, message}.

    `resolve=True` (at the job) also follows symbolic links with os.path.realpath.
    """
    if not isinstance(policy, PathPolicy):
        policy = PathPolicy.from_mapping(policy)
    errors = []
    data = spec.model_dump(mode="json") if hasattr(spec, "model_dump") else spec
    if _get(data, TRUST_FIELD) is True and not policy.allow_trust_remote_code:
        errors.append({"field": TRUST_FIELD, "message": (
            f"cluster {policy.cluster} does not allow model.trust_remote_code (running code "
            "from a model folder): set model.trust_remote_code=false")})
    for name, kind, path in spec_paths(data):
        message = path_problem(name, kind, path, policy, resolve=resolve)
        if message:
            errors.append({"field": name, "message": message})
    return errors


def path_problem(name: str, kind: str, path: str, policy: PathPolicy, *,
                 resolve: bool = False) -> str | None:
    """Why `path` (of field `name`, a `kind` path) is outside the policy, or None."""
    roots = policy.roots(kind)
    if kind == "model" and (_is_tiny_preset(path) or is_registry_uri(path)):
        return None  # a registered version is fetched from the registry: no root applies
    where = f"the {kind} roots of cluster {policy.cluster} ({', '.join(roots)})"
    if not os.path.isabs(path):  # refused with or without roots
        under = f"under {where}" if roots else "on the cluster"
        return (f"{name} {path} is a relative path, which the job would resolve in its own "
                f"temporary working directory: give an absolute path {under}")
    if not roots:
        return None
    normal = os.path.realpath(path) if resolve else _normal(path)
    if resolve:  # a root may itself be a link (/models -> /mnt/models)
        roots = (*roots, *(os.path.realpath(root) for root in roots))
    if any(is_inside(normal, root) for root in roots):
        return None
    shown = path if normal == path else f"{path} (that is {normal})"
    return f"{name} {shown} is outside {where}"


def _is_tiny_preset(path: str) -> bool:
    """`tiny:<name>` of a built-in preset: no file is read, so no root applies (any other
    `tiny:` text is a relative path like any other)."""
    from rl_core.models.presets import parse_tiny_path  # torch-free

    try:
        return parse_tiny_path(path) is not None
    except ValueError:
        return False


def env_policy(environ: Mapping[str, str] | None = None) -> PathPolicy | None:
    """The policy the platform passed to the job in ASCENT_PATH_POLICY, or None."""
    text = (os.environ if environ is None else environ).get(POLICY_ENV, "").strip()
    return PathPolicy.from_json(text) if text else None


def enforce(errors: list[dict[str, str]]) -> None:
    """Raise InputError (exit status 2) with every refused path on one line."""
    from rl_core.errors import InputError

    if errors:
        raise InputError("path policy: " + "; ".join(e["message"] for e in errors))


def enforce_at_job(spec: Any = None, *, named: Sequence[tuple[str, str, str]] = (),
                   environ: Mapping[str, str] | None = None) -> None:
    """At the job, before anything is read: check `spec` and the (field, kind, path) items in
    `named` with symbolic links resolved against the policy in ASCENT_PATH_POLICY, if any."""
    from rl_core.errors import InputError

    try:
        policy = env_policy(environ)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    if policy is None:
        return
    errors = check_paths(spec, policy, resolve=True) if spec is not None else []
    for name, kind, path in named:
        message = path_problem(name, kind, path, policy, resolve=True)
        if message:
            errors.append({"field": name, "message": message})
    enforce(errors)
