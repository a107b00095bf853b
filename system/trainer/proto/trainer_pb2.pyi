from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Tensor(_message.Message):
    __slots__ = ("shape", "dtype", "data")
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    data: bytes
    def __init__(self, shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class ParametersRequest(_message.Message):
    __slots__ = ("job", "worker", "after_step", "wait_s", "term")
    JOB_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    AFTER_STEP_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    job: str
    worker: int
    after_step: int
    wait_s: float
    term: int
    def __init__(self, job: _Optional[str] = ..., worker: _Optional[int] = ..., after_step: _Optional[int] = ..., wait_s: _Optional[float] = ..., term: _Optional[int] = ...) -> None: ...

class ParametersReply(_message.Message):
    __slots__ = ("job", "step", "term", "coordinator_id", "params", "done", "serving")
    JOB_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_ID_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    SERVING_FIELD_NUMBER: _ClassVar[int]
    job: str
    step: int
    term: int
    coordinator_id: str
    params: Tensor
    done: bool
    serving: bool
    def __init__(self, job: _Optional[str] = ..., step: _Optional[int] = ..., term: _Optional[int] = ..., coordinator_id: _Optional[str] = ..., params: _Optional[_Union[Tensor, _Mapping]] = ..., done: _Optional[bool] = ..., serving: _Optional[bool] = ...) -> None: ...

class GradientPush(_message.Message):
    __slots__ = ("job", "worker", "step", "term", "gradient", "rows", "wait_s")
    JOB_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    GRADIENT_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    job: str
    worker: int
    step: int
    term: int
    gradient: Tensor
    rows: int
    wait_s: float
    def __init__(self, job: _Optional[str] = ..., worker: _Optional[int] = ..., step: _Optional[int] = ..., term: _Optional[int] = ..., gradient: _Optional[_Union[Tensor, _Mapping]] = ..., rows: _Optional[int] = ..., wait_s: _Optional[float] = ...) -> None: ...

class GradientReply(_message.Message):
    __slots__ = ("accepted", "reason", "step", "term", "next")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    reason: str
    step: int
    term: int
    next: ParametersReply
    def __init__(self, accepted: _Optional[bool] = ..., reason: _Optional[str] = ..., step: _Optional[int] = ..., term: _Optional[int] = ..., next: _Optional[_Union[ParametersReply, _Mapping]] = ...) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("pull", "push")
    PULL_FIELD_NUMBER: _ClassVar[int]
    PUSH_FIELD_NUMBER: _ClassVar[int]
    pull: ParametersRequest
    push: GradientPush
    def __init__(self, pull: _Optional[_Union[ParametersRequest, _Mapping]] = ..., push: _Optional[_Union[GradientPush, _Mapping]] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("coordinator_id", "term", "active", "step", "loss", "accuracy", "last_checkpoint_step", "last_checkpoint_version", "skipped_gradients", "done", "error")
    COORDINATOR_ID_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    ACCURACY_FIELD_NUMBER: _ClassVar[int]
    LAST_CHECKPOINT_STEP_FIELD_NUMBER: _ClassVar[int]
    LAST_CHECKPOINT_VERSION_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_GRADIENTS_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    coordinator_id: str
    term: int
    active: bool
    step: int
    loss: float
    accuracy: float
    last_checkpoint_step: int
    last_checkpoint_version: int
    skipped_gradients: int
    done: bool
    error: str
    def __init__(self, coordinator_id: _Optional[str] = ..., term: _Optional[int] = ..., active: _Optional[bool] = ..., step: _Optional[int] = ..., loss: _Optional[float] = ..., accuracy: _Optional[float] = ..., last_checkpoint_step: _Optional[int] = ..., last_checkpoint_version: _Optional[int] = ..., skipped_gradients: _Optional[int] = ..., done: _Optional[bool] = ..., error: _Optional[str] = ...) -> None: ...
