from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MessageType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MESSAGE_TYPE_UNSPECIFIED: _ClassVar[MessageType]
    PRE_VOTE: _ClassVar[MessageType]
    PRE_VOTE_RESPONSE: _ClassVar[MessageType]
    VOTE: _ClassVar[MessageType]
    VOTE_RESPONSE: _ClassVar[MessageType]
    APPEND: _ClassVar[MessageType]
    APPEND_RESPONSE: _ClassVar[MessageType]
    HEARTBEAT: _ClassVar[MessageType]
    HEARTBEAT_RESPONSE: _ClassVar[MessageType]
    SNAPSHOT: _ClassVar[MessageType]
    SNAPSHOT_RESPONSE: _ClassVar[MessageType]
    TIMEOUT_NOW: _ClassVar[MessageType]

class EntryKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENTRY_KIND_NORMAL: _ClassVar[EntryKind]
    ENTRY_KIND_NOOP: _ClassVar[EntryKind]
    ENTRY_KIND_CONFIG: _ClassVar[EntryKind]
MESSAGE_TYPE_UNSPECIFIED: MessageType
PRE_VOTE: MessageType
PRE_VOTE_RESPONSE: MessageType
VOTE: MessageType
VOTE_RESPONSE: MessageType
APPEND: MessageType
APPEND_RESPONSE: MessageType
HEARTBEAT: MessageType
HEARTBEAT_RESPONSE: MessageType
SNAPSHOT: MessageType
SNAPSHOT_RESPONSE: MessageType
TIMEOUT_NOW: MessageType
ENTRY_KIND_NORMAL: EntryKind
ENTRY_KIND_NOOP: EntryKind
ENTRY_KIND_CONFIG: EntryKind

class Entry(_message.Message):
    __slots__ = ("term", "index", "data", "kind")
    TERM_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    term: int
    index: int
    data: bytes
    kind: EntryKind
    def __init__(self, term: _Optional[int] = ..., index: _Optional[int] = ..., data: _Optional[bytes] = ..., kind: _Optional[_Union[EntryKind, str]] = ...) -> None: ...

class SnapshotMeta(_message.Message):
    __slots__ = ("index", "term", "voters", "learners", "member_info")
    class MemberInfoEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    VOTERS_FIELD_NUMBER: _ClassVar[int]
    LEARNERS_FIELD_NUMBER: _ClassVar[int]
    MEMBER_INFO_FIELD_NUMBER: _ClassVar[int]
    index: int
    term: int
    voters: _containers.RepeatedScalarFieldContainer[str]
    learners: _containers.RepeatedScalarFieldContainer[str]
    member_info: _containers.ScalarMap[str, str]
    def __init__(self, index: _Optional[int] = ..., term: _Optional[int] = ..., voters: _Optional[_Iterable[str]] = ..., learners: _Optional[_Iterable[str]] = ..., member_info: _Optional[_Mapping[str, str]] = ...) -> None: ...

class BatchPiece(_message.Message):
    __slots__ = ("data", "more")
    DATA_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    more: bool
    def __init__(self, data: _Optional[bytes] = ..., more: _Optional[bool] = ...) -> None: ...

class RaftMessage(_message.Message):
    __slots__ = ("type", "src", "dst", "term", "log_term", "index", "entries", "commit", "reject", "reject_hint", "reject_term", "context", "snapshot", "offset", "data", "done")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LOG_TERM_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    REJECT_FIELD_NUMBER: _ClassVar[int]
    REJECT_HINT_FIELD_NUMBER: _ClassVar[int]
    REJECT_TERM_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    type: MessageType
    src: str
    dst: str
    term: int
    log_term: int
    index: int
    entries: _containers.RepeatedCompositeFieldContainer[Entry]
    commit: int
    reject: bool
    reject_hint: int
    reject_term: int
    context: bytes
    snapshot: SnapshotMeta
    offset: int
    data: bytes
    done: bool
    def __init__(self, type: _Optional[_Union[MessageType, str]] = ..., src: _Optional[str] = ..., dst: _Optional[str] = ..., term: _Optional[int] = ..., log_term: _Optional[int] = ..., index: _Optional[int] = ..., entries: _Optional[_Iterable[_Union[Entry, _Mapping]]] = ..., commit: _Optional[int] = ..., reject: _Optional[bool] = ..., reject_hint: _Optional[int] = ..., reject_term: _Optional[int] = ..., context: _Optional[bytes] = ..., snapshot: _Optional[_Union[SnapshotMeta, _Mapping]] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ..., done: _Optional[bool] = ...) -> None: ...

class MessageBatch(_message.Message):
    __slots__ = ("src", "messages")
    SRC_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    src: str
    messages: _containers.RepeatedCompositeFieldContainer[RaftMessage]
    def __init__(self, src: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[RaftMessage, _Mapping]]] = ...) -> None: ...

class SendAck(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
