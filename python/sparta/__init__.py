"""Sparta from Python: the same Rust core as the ``sparta`` CLI.

* :class:`Job` - a job config from a TOML path, TOML text or a dict, validated as the CLI
  validates ``--config`` (a ``ValueError`` naming the field);
* :func:`train` / :class:`Trainer` - training on files (TSV/CSV plain or gzip, Parquet,
  ``s3://`` objects: the CLI's inputs) or on Python iterables of pandas DataFrames or pyarrow
  RecordBatches/Tables (columns by the schema's names); the summary comes back as a dict;
* :func:`evaluate` - AUC, log loss, GAUC, per task;
* :class:`Model` - an export directory loaded for ``predict`` (numpy arrays), ``tables()``,
  ``reload()``;
* :func:`inspect_checkpoints` - checkpoints as Python objects;
* :func:`train_worker` - one worker of a PS cluster (``sparta ps`` shards), as
  ``sparta worker`` runs it.

Rust work runs with the GIL released. Progress and Rust log lines go to the ``logging`` logger
``"sparta"`` (``logging.basicConfig(level=logging.INFO)`` shows them). Ctrl-C during training
stops after the current step, writes the final checkpoint (and export), then raises
``KeyboardInterrupt``, as SIGINT does for the CLI.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Union

import numpy as np

from . import _sparta

__version__: str = _sparta.__version__

__all__ = [
    "Job",
    "Trainer",
    "Model",
    "Checkpoint",
    "CheckpointReport",
    "train",
    "evaluate",
    "inspect_checkpoints",
    "train_worker",
]

PathLike = Union[str, "os.PathLike[str]"]

# ---------------------------------------------------------------------------------------------
# Jobs


class Job:
    """A validated job config (the CLI's ``--config``); immutable.

    Build one with :meth:`from_path`, :meth:`from_toml` or :meth:`from_dict`, or pass a path,
    TOML text or dict wherever a job is expected (:meth:`of`).
    """

    __slots__ = ("_inner",)

    def __init__(self, inner: "_sparta.Job") -> None:
        self._inner = inner

    @classmethod
    def from_path(cls, path: PathLike) -> "Job":
        """A job from a TOML file (``OSError`` if it cannot be read)."""
        return cls(_sparta.Job.from_path(os.fspath(path)))

    @classmethod
    def from_toml(cls, text: str) -> "Job":
        """A job from TOML text."""
        return cls(_sparta.Job.from_toml(text))

    @classmethod
    def from_dict(cls, sections: Mapping[str, Any]) -> "Job":
        """A job from a dict of sections, e.g. ``{"model": {"kind": "dcn"}}`` (keys and values
        as in the TOML file; leave a key out for its default)."""
        if not isinstance(sections, Mapping):
            raise TypeError(f"expected a dict of sections, got {type(sections).__name__}")
        return cls(_sparta.Job.from_json(json.dumps(sections, default=_json_default)))

    @classmethod
    def of(cls, job: "JobLike") -> "Job":
        """``job`` as a Job: a Job, a dict of sections, TOML text, or a path to a TOML file."""
        if isinstance(job, Job):
            return job
        if isinstance(job, Mapping):
            return cls.from_dict(job)
        if isinstance(job, os.PathLike):
            return cls.from_path(job)
        if isinstance(job, str):
            if "\n" in job or "=" in job or "[" in job:
                return cls.from_toml(job)
            return cls.from_path(job)
        raise TypeError(
            f"expected a Job, a dict, TOML text or a path, got {type(job).__name__}"
        )

    def with_overrides(self, sections: Mapping[str, Any]) -> "Job":
        """This job with ``sections`` merged in key by key, e.g.
        ``job.with_overrides({"train": {"epochs": 2}})``."""
        if not sections:
            return self
        return Job(self._inner.with_overrides(json.dumps(sections, default=_json_default)))

    def to_dict(self) -> Dict[str, Any]:
        """Every section, defaults included."""
        return json.loads(self._inner.to_json())

    def to_toml(self) -> str:
        """The job as TOML text (what ``sparta train --config`` reads)."""
        return self._inner.to_toml()

    @property
    def columns(self) -> List[tuple]:
        """The input columns as ``(name, kind)`` in line order."""
        return list(self._inner.columns())

    @property
    def task_names(self) -> List[str]:
        """The model's tasks, in output order."""
        return list(self._inner.task_names())

    def __repr__(self) -> str:
        return repr(self._inner)


JobLike = Union[Job, Mapping[str, Any], str, "os.PathLike[str]"]


def _json_default(v: Any) -> Any:
    if isinstance(v, os.PathLike):
        return os.fspath(v)
    if isinstance(v, np.generic):
        return v.item()
    raise TypeError(f"{type(v).__name__} is not a job value")


# Keyword overrides of train(): (section, key), as the CLI's flags.
_OVERRIDES = {
    "epochs": ("train", "epochs"),
    "batch_size": ("data", "batch_size"),
    "threads": ("train", "threads"),
    "reader_threads": ("data", "reader_threads"),
    "seed": ("train", "seed"),
    "max_rows": ("train", "max_rows"),
    "pipeline": ("train", "pipeline"),
    "checkpoint_dir": ("train", "checkpoint_dir"),
    "checkpoint_every_steps": ("train", "checkpoint_every_steps"),
    "export_dir": ("export", "dir"),
    "export_every_steps": ("export", "every_steps"),
    "export_every_secs": ("export", "every_secs"),
}


def _overridden(job: JobLike, overrides: Mapping[str, Any]) -> Job:
    j = Job.of(job)
    sections: Dict[str, Dict[str, Any]] = {}
    for k, v in overrides.items():
        if k not in _OVERRIDES:
            raise TypeError(
                f"unexpected keyword {k!r} (job settings: {', '.join(sorted(_OVERRIDES))}; "
                "anything else goes in the job)"
            )
        if v is None:
            continue
        section, key = _OVERRIDES[k]
        sections.setdefault(section, {})[key] = os.fspath(v) if isinstance(v, os.PathLike) else v
    return j.with_overrides(sections)


# ---------------------------------------------------------------------------------------------
# Data: files or frames


def _is_dataframe(x: Any) -> bool:
    """A pandas DataFrame (pandas is imported only when a frame may be one)."""
    if not type(x).__module__.startswith("pandas"):
        return False
    import pandas as pd

    return isinstance(x, pd.DataFrame)


def _is_frame(x: Any) -> bool:
    """One frame (rather than an iterable of frames): a pandas DataFrame, a pyarrow
    RecordBatch or Table, or another object exporting Arrow data that is not an iterable of
    batches (a RecordBatchReader, a chunked CSV reader are iterables of frames)."""
    import pyarrow as pa

    if _is_dataframe(x) or isinstance(x, (pa.RecordBatch, pa.Table)):
        return True
    if isinstance(x, pa.RecordBatchReader) or hasattr(x, "__iter__"):
        return False
    return hasattr(x, "__arrow_c_array__") or hasattr(x, "__arrow_c_stream__")


def _record_batches(frame: Any) -> Iterator[Any]:
    """The pyarrow RecordBatches of one frame: a pandas DataFrame, a pyarrow RecordBatch or
    Table, or anything exporting the Arrow PyCapsule interface. Dictionary (categorical)
    columns are decoded; buffers are not copied where the types allow."""
    import pyarrow as pa

    if isinstance(frame, pa.RecordBatch):
        batches: Iterable[Any] = [frame]
    elif isinstance(frame, pa.Table):
        batches = frame.to_batches()
    elif _is_dataframe(frame):
        # Through a Table: pandas' Arrow-backed columns may be chunked.
        batches = pa.Table.from_pandas(frame, preserve_index=False).to_batches()
    elif hasattr(frame, "__arrow_c_stream__"):
        batches = pa.table(frame).to_batches()
    elif hasattr(frame, "__arrow_c_array__"):
        batches = [pa.record_batch(frame)]
    else:
        raise TypeError(
            "expected a pandas DataFrame or a pyarrow RecordBatch or Table, got "
            f"{type(frame).__name__}"
        )
    for b in batches:
        if any(pa.types.is_dictionary(f.type) for f in b.schema):
            b = pa.RecordBatch.from_arrays(
                [
                    c.dictionary_decode() if pa.types.is_dictionary(c.type) else c
                    for c in b.columns
                ],
                names=b.schema.names,
            )
        yield b


class _Frames:
    """Record batches of ``data`` (one frame or an iterable of frames), ``epochs`` times."""

    def __init__(self, data: Any, epochs: int = 1) -> None:
        if _is_frame(data):
            data = [data]
        elif isinstance(data, Iterator) and epochs > 1:
            raise ValueError(
                f"train.epochs = {epochs} needs data that can be read {epochs} times: pass a "
                "list (or another re-iterable) of frames, not a one-shot iterator"
            )
        self._data = data
        self._epochs = max(1, epochs)

    def __iter__(self) -> Iterator[Any]:
        for _ in range(self._epochs):
            for frame in self._data:
                yield from _record_batches(frame)


Data = Union[PathLike, Sequence[PathLike], Any]


def _split(data: Any, epochs: int = 1) -> tuple:
    """``(files, frames)``: paths go to the Rust readers, everything else is frames."""
    if data is None:
        return [], None
    if isinstance(data, (str, os.PathLike)):
        return [os.fspath(data)], None
    if isinstance(data, (list, tuple)) and data and all(
        isinstance(d, (str, os.PathLike)) for d in data
    ):
        return [os.fspath(d) for d in data], None
    return [], iter(_Frames(data, epochs))


# ---------------------------------------------------------------------------------------------
# Training and evaluation


class Trainer:
    """An embedded trainer (tables and dense model in this process).

    ``resume``: continue from the newest valid checkpoint in that directory (and keep
    checkpointing there unless the job says otherwise); none there is an error unless
    ``resume_if_present``. A Trainer trains once; it evaluates any number of times.
    """

    def __init__(
        self,
        job: JobLike,
        *,
        resume: Optional[PathLike] = None,
        resume_if_present: bool = False,
        **overrides: Any,
    ) -> None:
        self.job = _overridden(job, overrides)
        self._inner = _sparta.Trainer(
            self.job._inner,
            os.fspath(resume) if resume is not None else None,
            resume_if_present,
        )

    def train(
        self,
        data: Data,
        *,
        test: Optional[Data] = None,
        progress: Optional[Callable[[Dict[str, Any]], Any]] = None,
        progress_every: float = 1.0,
        log_progress: bool = True,
    ) -> Dict[str, Any]:
        """Trains on ``data`` (a path, a list of paths, a DataFrame/RecordBatch/Table, or an
        iterable of them), then evaluates on ``test`` when given. Returns the run summary
        (the CLI's ``--summary-json``) as a dict.

        ``progress(info)`` is called at most every ``progress_every`` seconds and at the end
        with ``samples``, ``loss``, ``samples_per_sec``, ``seconds``, ``bytes``, ``done``; an
        exception it raises stops training after the step and is raised again here.
        """
        epochs = int(self.job.to_dict()["train"]["epochs"])
        files, frames = _split(data, epochs)
        test_files, test_frames = _split(test)
        out = self._inner.train(
            files,
            frames,
            test_files,
            test_frames,
            progress,
            progress_every,
            log_progress,
        )
        return json.loads(out)

    def evaluate(self, data: Data) -> Dict[str, Any]:
        """Metrics of the current model on ``data``: ``auc``, ``logloss``,
        ``positive_rate``, ``calibration``, ``rows`` (and ``gauc`` with ``train.gauc_by``) of
        the first task, and every task's under ``tasks``."""
        files, frames = _split(data)
        return json.loads(self._inner.evaluate(files, frames))


def train(
    job: JobLike,
    data: Data,
    *,
    test: Optional[Data] = None,
    resume: Optional[PathLike] = None,
    resume_if_present: bool = False,
    progress: Optional[Callable[[Dict[str, Any]], Any]] = None,
    progress_every: float = 1.0,
    log_progress: bool = True,
    **overrides: Any,
) -> Dict[str, Any]:
    """Trains ``job`` on ``data`` and returns the summary dict (see :meth:`Trainer.train`).

    Keyword overrides set job fields as the CLI's flags do: ``epochs``, ``batch_size``,
    ``threads``, ``reader_threads``, ``seed``, ``max_rows``, ``pipeline``, ``checkpoint_dir``,
    ``checkpoint_every_steps``, ``export_dir``, ``export_every_steps``, ``export_every_secs``.
    """
    t = Trainer(job, resume=resume, resume_if_present=resume_if_present, **overrides)
    return t.train(
        data,
        test=test,
        progress=progress,
        progress_every=progress_every,
        log_progress=log_progress,
    )


def evaluate(job: JobLike, data: Data, *, checkpoint: PathLike) -> Dict[str, Any]:
    """Metrics (see :meth:`Trainer.evaluate`) of the model restored from the newest valid
    checkpoint in ``checkpoint`` on ``data``."""
    return Trainer(job, resume=checkpoint).evaluate(data)


# ---------------------------------------------------------------------------------------------
# A PS-cluster worker


def _paths(data: Optional[Union[PathLike, Sequence[PathLike]]], what: str) -> List[str]:
    if data is None:
        return []
    if isinstance(data, (str, os.PathLike)):
        return [os.fspath(data)]
    if isinstance(data, (list, tuple)) and all(isinstance(d, (str, os.PathLike)) for d in data):
        return [os.fspath(d) for d in data]
    raise TypeError(f"{what}: expected a path or a list of paths, got {type(data).__name__}")


def _addrs(addrs: Union[str, Sequence[str]], what: str) -> List[str]:
    if isinstance(addrs, str):
        return [a.strip() for a in addrs.split(",") if a.strip()]
    if isinstance(addrs, (list, tuple)) and all(isinstance(a, str) for a in addrs):
        return list(addrs)
    raise TypeError(
        f"{what}: expected host:port addresses (a list, or one comma separated string), got "
        f"{type(addrs).__name__}"
    )


def _optional_path(p: Optional[PathLike]) -> Optional[str]:
    return None if p is None else os.fspath(p)


def train_worker(
    job: JobLike,
    ps: Union[str, Sequence[str]],
    rank: int,
    num_workers: int,
    train: Union[PathLike, Sequence[PathLike]] = (),
    test: Optional[Union[PathLike, Sequence[PathLike]]] = None,
    *,
    token: Optional[str] = None,
    coordinator: Optional[str] = None,
    wire_compression: str = "none",
    ring: Union[str, Sequence[str]] = (),
    ring_compression: str = "none",
    ring_tls_cert: Optional[PathLike] = None,
    ring_tls_key: Optional[PathLike] = None,
    max_message_mb: int = 256,
    rpc_timeout_secs: float = 300,
    retries: int = 4,
    ps_retry_secs: Optional[float] = None,
    metrics_listen: Optional[str] = None,
    tls_ca: Optional[PathLike] = None,
    tls_domain: Optional[str] = None,
    quiet: bool = False,
    **overrides: Any,
) -> Dict[str, Any]:
    """Runs worker ``rank`` of ``num_workers`` of a PS cluster: the same worker as
    ``sparta worker`` (one entry point in Rust), in this process. Returns the summary dict
    that ``sparta worker --summary-json`` writes: the training summary (``train_rows``,
    ``steps``, ``train_loss``, ...) plus ``rank``, ``workers``, ``ps_shards``, ``wire`` (RPCs
    and bytes on the wire) and, with a ring, ``dense``.

    ``ps``: the shards' ``host:port`` addresses in shard order (a list, or comma separated).
    The worker trains on its 1/``num_workers`` part of each ``train`` file; rank 0 then waits
    for every worker, writes the end-of-job checkpoint (when the job checkpoints) and
    evaluates the cluster's model on all of ``test`` (``test_auc``, ``test_logloss``, ...).
    The shards must run the same job (``sparta ps --config``) and ``--workers num_workers``.

    ``token``: the cluster's shared token (default: the ``SPARTA_TOKEN`` environment
    variable). The other arguments are ``sparta worker``'s flags of the same names:
    ``coordinator`` (a replicated cluster's ``sparta coordinator``), ``wire_compression`` and
    ``ring_compression`` (``none``, ``fp16``, ``bf16``), ``ring`` (dense mode allreduce: every
    worker's ring address in rank order), ``ring_tls_cert``/``ring_tls_key``, ``tls_ca`` and
    ``tls_domain`` (TLS to the shards and on the ring), ``max_message_mb``,
    ``rpc_timeout_secs``, ``retries``, ``ps_retry_secs`` (how long an unreachable shard is
    retried; default the job's ``train.ps_retry_secs``), ``metrics_listen`` (Prometheus
    ``/metrics``), ``quiet`` (no progress lines). Keyword overrides set job fields as for
    :func:`train` (``epochs``, ``batch_size``, ...; the shards' job must agree on tables and
    model).

    Errors: ``ValueError`` for a wrong argument, token or option the cluster refuses,
    ``RuntimeError`` for unreachable shards and failed training. Ctrl-C stops training after the
    current step (the worker leaves the job as at the end of its input) and is then raised as
    ``KeyboardInterrupt``.
    """
    j = _overridden(job, overrides)
    out = _sparta.train_worker(
        j._inner,
        _addrs(ps, "ps"),
        rank,
        num_workers,
        _paths(train, "train"),
        _paths(test, "test"),
        token,
        coordinator,
        wire_compression,
        _addrs(ring, "ring"),
        ring_compression,
        _optional_path(ring_tls_cert),
        _optional_path(ring_tls_key),
        max_message_mb,
        float(rpc_timeout_secs),
        retries,
        None if ps_retry_secs is None else float(ps_retry_secs),
        metrics_listen,
        _optional_path(tls_ca),
        tls_domain,
        quiet,
    )
    return json.loads(out)


# ---------------------------------------------------------------------------------------------
# Prediction


class Model:
    """An export directory loaded for scoring: its newest full version and the deltas after
    it (as ``sparta predict`` and ``sparta serve`` load it)."""

    def __init__(self, export_dir: PathLike) -> None:
        self._inner = _sparta.Model(os.fspath(export_dir))

    def predict(self, data: Any) -> Union[np.ndarray, Dict[str, np.ndarray]]:
        """Probabilities for ``data``: a pandas DataFrame, a pyarrow RecordBatch or Table
        (columns by the job's names; label columns are not needed), or a list of dicts (as
        ``sparta serve`` reads them; a bad row raises ``ValueError``).

        Returns a float32 array of one probability per row (``nan`` for a frame row that does
        not parse), or for a multi-task model a dict task -> array.
        """
        if isinstance(data, list) and (not data or isinstance(data[0], Mapping)):
            buf, rows, tasks = self._inner.predict_json(json.dumps(data, default=_json_default))
            return self._shape(buf, rows, tasks)
        parts = [
            self._shape(*self._inner.predict_arrow(b), split=False)
            for b in _record_batches(data)
        ]
        tasks = len(self.task_names)
        out = np.concatenate(parts) if parts else np.empty((0, tasks), dtype=np.float32)
        return self._split_tasks(out)

    def _shape(self, buf: bytearray, rows: int, tasks: int, split: bool = True) -> Any:
        a = np.frombuffer(buf, dtype=np.float32).reshape(rows, tasks)
        return self._split_tasks(a) if split else a

    def _split_tasks(self, a: np.ndarray) -> Union[np.ndarray, Dict[str, np.ndarray]]:
        names = self.task_names
        if len(names) == 1:
            return a[:, 0]
        return {n: a[:, i] for i, n in enumerate(names)}

    def tables(self) -> Dict[str, Dict[str, Any]]:
        """Every logical table: ``rows``, ``dim``, its ``physical`` table, and ``wide_rows``
        (its first-order weights, or None)."""
        return {
            name: {"rows": rows, "dim": dim, "physical": phys, "wide_rows": wide}
            for name, rows, dim, phys, wide in self._inner.tables()
        }

    def reload(self) -> bool:
        """Loads the newest version of the export directory if newer than the one held;
        returns whether it was."""
        return self._inner.reload()

    @property
    def task_names(self) -> List[str]:
        """The tasks, in output order."""
        return list(self._inner.task_names())

    @property
    def version(self) -> int:
        """The export version held."""
        return self._inner.version

    @property
    def step(self) -> int:
        """The training step of the version held."""
        return self._inner.step

    @property
    def job(self) -> Job:
        """The job the export was trained with."""
        return Job.from_toml(self._inner.job_toml)

    def __repr__(self) -> str:
        return f"Model({os.fspath(self._inner.dir)!r}, version={self.version}, step={self.step})"


# ---------------------------------------------------------------------------------------------
# Checkpoints


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint of a directory as inspection found it: ``id`` (increasing), ``name``
    (its directory, ``ckpt-0000000000000042``: what summaries call ``last_checkpoint`` and
    ``resumed_from``), ``kind`` (``full`` or ``incremental``), ``step``, ``valid``; ``raw``
    holds the whole report (files, tables, sizes)."""

    id: int
    name: str
    kind: str
    step: int
    valid: bool
    raw: Dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def reason(self) -> Optional[str]:
        """Why it is not valid (None when it is)."""
        return self.raw.get("reason")


@dataclass(frozen=True)
class CheckpointReport:
    """Every checkpoint of a directory, its files verified, and the one a restore would use
    (``sparta checkpoint inspect --json``)."""

    checkpoints: List[Checkpoint]
    restorable: Optional[int]
    raw: Dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def latest(self) -> Optional[Checkpoint]:
        """The checkpoint a restore would use."""
        return next((c for c in self.checkpoints if c.id == self.restorable), None)


def inspect_checkpoints(directory: PathLike) -> CheckpointReport:
    """Inspects the checkpoints in ``directory`` (local or ``s3://``)."""
    raw = json.loads(_sparta.inspect_checkpoints(os.fspath(directory)))
    cps = [
        Checkpoint(
            id=int(c["id"]),
            name=str(c.get("dir") or c["id"]),
            kind=str(c.get("kind") or ""),
            step=int(c.get("step") or 0),
            valid=bool(c.get("valid", False)),
            raw=c,
        )
        for c in raw.get("checkpoints", [])
    ]
    r = raw.get("restorable")
    return CheckpointReport(checkpoints=cps, restorable=None if r is None else int(r), raw=raw)
