"""Type stubs of the ``sparta`` package (the API of ``sparta/__init__.py``)."""

import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

__version__: str

PathLike = Union[str, os.PathLike[str]]
JobLike = Union["Job", Mapping[str, Any], str, os.PathLike[str]]
Data = Union[PathLike, Sequence[PathLike], Any]
Progress = Callable[[Dict[str, Any]], Any]

class Job:
    @classmethod
    def from_path(cls, path: PathLike) -> Job: ...
    @classmethod
    def from_toml(cls, text: str) -> Job: ...
    @classmethod
    def from_dict(cls, sections: Mapping[str, Any]) -> Job: ...
    @classmethod
    def of(cls, job: JobLike) -> Job: ...
    def with_overrides(self, sections: Mapping[str, Any]) -> Job: ...
    def to_dict(self) -> Dict[str, Any]: ...
    def to_toml(self) -> str: ...
    @property
    def columns(self) -> List[Tuple[str, str]]: ...
    @property
    def task_names(self) -> List[str]: ...

class Trainer:
    job: Job
    def __init__(
        self,
        job: JobLike,
        *,
        resume: Optional[PathLike] = None,
        resume_if_present: bool = False,
        **overrides: Any,
    ) -> None: ...
    def train(
        self,
        data: Data,
        *,
        test: Optional[Data] = None,
        progress: Optional[Progress] = None,
        progress_every: float = 1.0,
        log_progress: bool = True,
    ) -> Dict[str, Any]: ...
    def evaluate(self, data: Data) -> Dict[str, Any]: ...

def train(
    job: JobLike,
    data: Data,
    *,
    test: Optional[Data] = None,
    resume: Optional[PathLike] = None,
    resume_if_present: bool = False,
    progress: Optional[Progress] = None,
    progress_every: float = 1.0,
    log_progress: bool = True,
    epochs: Optional[int] = None,
    batch_size: Optional[int] = None,
    threads: Optional[int] = None,
    reader_threads: Optional[int] = None,
    seed: Optional[int] = None,
    max_rows: Optional[int] = None,
    pipeline: Optional[bool] = None,
    checkpoint_dir: Optional[PathLike] = None,
    checkpoint_every_steps: Optional[int] = None,
    export_dir: Optional[PathLike] = None,
    export_every_steps: Optional[int] = None,
    export_every_secs: Optional[float] = None,
) -> Dict[str, Any]: ...
def evaluate(job: JobLike, data: Data, *, checkpoint: PathLike) -> Dict[str, Any]: ...
def train_worker(
    job: JobLike,
    ps: Union[str, Sequence[str]],
    rank: int,
    num_workers: int,
    train: Union[PathLike, Sequence[PathLike]] = ...,
    test: Optional[Union[PathLike, Sequence[PathLike]]] = None,
    *,
    token: Optional[str] = None,
    coordinator: Optional[str] = None,
    wire_compression: str = "none",
    ring: Union[str, Sequence[str]] = ...,
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
    epochs: Optional[int] = None,
    batch_size: Optional[int] = None,
    threads: Optional[int] = None,
    reader_threads: Optional[int] = None,
    seed: Optional[int] = None,
    max_rows: Optional[int] = None,
    pipeline: Optional[bool] = None,
    checkpoint_dir: Optional[PathLike] = None,
    checkpoint_every_steps: Optional[int] = None,
    export_dir: Optional[PathLike] = None,
    export_every_steps: Optional[int] = None,
    export_every_secs: Optional[float] = None,
) -> Dict[str, Any]: ...

class Model:
    def __init__(self, export_dir: PathLike) -> None: ...
    def predict(self, data: Any) -> Union[np.ndarray, Dict[str, np.ndarray]]: ...
    def tables(self) -> Dict[str, Dict[str, Any]]: ...
    def reload(self) -> bool: ...
    @property
    def task_names(self) -> List[str]: ...
    @property
    def version(self) -> int: ...
    @property
    def step(self) -> int: ...
    @property
    def job(self) -> Job: ...

@dataclass(frozen=True)
class Checkpoint:
    id: int
    name: str
    kind: str
    step: int
    valid: bool
    raw: Dict[str, Any]
    @property
    def reason(self) -> Optional[str]: ...

@dataclass(frozen=True)
class CheckpointReport:
    checkpoints: List[Checkpoint]
    restorable: Optional[int]
    raw: Dict[str, Any]
    @property
    def latest(self) -> Optional[Checkpoint]: ...

def inspect_checkpoints(directory: PathLike) -> CheckpointReport: ...
