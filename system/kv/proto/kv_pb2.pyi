from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Consistency(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LINEARIZABLE: _ClassVar[Consistency]
    STALE: _ClassVar[Consistency]
LINEARIZABLE: Consistency
STALE: Consistency

class Header(_message.Message):
    __slots__ = ("node_id", "term", "applied_index", "leader_id")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    term: int
    applied_index: int
    leader_id: str
    def __init__(self, node_id: _Optional[str] = ..., term: _Optional[int] = ..., applied_index: _Optional[int] = ..., leader_id: _Optional[str] = ...) -> None: ...

class PutRequest(_message.Message):
    __slots__ = ("key", "value", "expected_version", "request_id")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: bytes
    expected_version: int
    request_id: str
    def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ..., expected_version: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class PutResponse(_message.Message):
    __slots__ = ("applied", "version", "header")
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    applied: bool
    version: int
    header: Header
    def __init__(self, applied: _Optional[bool] = ..., version: _Optional[int] = ..., header: _Optional[_Union[Header, _Mapping]] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("key", "consistency")
    KEY_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_FIELD_NUMBER: _ClassVar[int]
    key: str
    consistency: Consistency
    def __init__(self, key: _Optional[str] = ..., consistency: _Optional[_Union[Consistency, str]] = ...) -> None: ...

class GetResponse(_message.Message):
    __slots__ = ("found", "value", "version", "stale", "header")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    found: bool
    value: bytes
    version: int
    stale: bool
    header: Header
    def __init__(self, found: _Optional[bool] = ..., value: _Optional[bytes] = ..., version: _Optional[int] = ..., stale: _Optional[bool] = ..., header: _Optional[_Union[Header, _Mapping]] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("key", "expected_version", "request_id")
    KEY_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    key: str
    expected_version: int
    request_id: str
    def __init__(self, key: _Optional[str] = ..., expected_version: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class DeleteResponse(_message.Message):
    __slots__ = ("applied", "existed", "version", "header")
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    EXISTED_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    applied: bool
    existed: bool
    version: int
    header: Header
    def __init__(self, applied: _Optional[bool] = ..., existed: _Optional[bool] = ..., version: _Optional[int] = ..., header: _Optional[_Union[Header, _Mapping]] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("node_id", "role", "term", "leader_id", "commit_index", "applied_index", "last_index", "snapshot_index", "peers", "snapshots_installed", "unsafe_mode", "last_snapshot_index", "cluster_id", "member_id", "voters", "learners", "vote_withheld", "member_addresses", "peer_transports", "snapshots_sending", "snapshots_sent", "config_index", "lead_transferee", "match_index", "catch_up_to")
    class PeersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class MemberAddressesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class PeerTransportsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class MatchIndexEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    COMMIT_INDEX_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_INDEX_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_INDEX_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_INSTALLED_FIELD_NUMBER: _ClassVar[int]
    UNSAFE_MODE_FIELD_NUMBER: _ClassVar[int]
    LAST_SNAPSHOT_INDEX_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    VOTERS_FIELD_NUMBER: _ClassVar[int]
    LEARNERS_FIELD_NUMBER: _ClassVar[int]
    VOTE_WITHHELD_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    PEER_TRANSPORTS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_SENDING_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_SENT_FIELD_NUMBER: _ClassVar[int]
    CONFIG_INDEX_FIELD_NUMBER: _ClassVar[int]
    LEAD_TRANSFEREE_FIELD_NUMBER: _ClassVar[int]
    MATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    CATCH_UP_TO_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    role: str
    term: int
    leader_id: str
    commit_index: int
    applied_index: int
    last_index: int
    snapshot_index: int
    peers: _containers.ScalarMap[str, str]
    snapshots_installed: int
    unsafe_mode: str
    last_snapshot_index: int
    cluster_id: str
    member_id: str
    voters: _containers.RepeatedScalarFieldContainer[str]
    learners: _containers.RepeatedScalarFieldContainer[str]
    vote_withheld: str
    member_addresses: _containers.ScalarMap[str, str]
    peer_transports: _containers.ScalarMap[str, str]
    snapshots_sending: _containers.RepeatedCompositeFieldContainer[SnapshotSend]
    snapshots_sent: int
    config_index: int
    lead_transferee: str
    match_index: _containers.ScalarMap[str, int]
    catch_up_to: int
    def __init__(self, node_id: _Optional[str] = ..., role: _Optional[str] = ..., term: _Optional[int] = ..., leader_id: _Optional[str] = ..., commit_index: _Optional[int] = ..., applied_index: _Optional[int] = ..., last_index: _Optional[int] = ..., snapshot_index: _Optional[int] = ..., peers: _Optional[_Mapping[str, str]] = ..., snapshots_installed: _Optional[int] = ..., unsafe_mode: _Optional[str] = ..., last_snapshot_index: _Optional[int] = ..., cluster_id: _Optional[str] = ..., member_id: _Optional[str] = ..., voters: _Optional[_Iterable[str]] = ..., learners: _Optional[_Iterable[str]] = ..., vote_withheld: _Optional[str] = ..., member_addresses: _Optional[_Mapping[str, str]] = ..., peer_transports: _Optional[_Mapping[str, str]] = ..., snapshots_sending: _Optional[_Iterable[_Union[SnapshotSend, _Mapping]]] = ..., snapshots_sent: _Optional[int] = ..., config_index: _Optional[int] = ..., lead_transferee: _Optional[str] = ..., match_index: _Optional[_Mapping[str, int]] = ..., catch_up_to: _Optional[int] = ...) -> None: ...

class SnapshotSend(_message.Message):
    __slots__ = ("peer", "index", "offset", "size", "seconds")
    PEER_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    peer: str
    index: int
    offset: int
    size: int
    seconds: float
    def __init__(self, peer: _Optional[str] = ..., index: _Optional[int] = ..., offset: _Optional[int] = ..., size: _Optional[int] = ..., seconds: _Optional[float] = ...) -> None: ...

class ChangeMembershipRequest(_message.Message):
    __slots__ = ("change", "node_id", "address", "peer_address")
    CHANGE_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PEER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    change: str
    node_id: str
    address: str
    peer_address: str
    def __init__(self, change: _Optional[str] = ..., node_id: _Optional[str] = ..., address: _Optional[str] = ..., peer_address: _Optional[str] = ...) -> None: ...

class ChangeMembershipResponse(_message.Message):
    __slots__ = ("index", "voters", "learners", "header")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    VOTERS_FIELD_NUMBER: _ClassVar[int]
    LEARNERS_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    index: int
    voters: _containers.RepeatedScalarFieldContainer[str]
    learners: _containers.RepeatedScalarFieldContainer[str]
    header: Header
    def __init__(self, index: _Optional[int] = ..., voters: _Optional[_Iterable[str]] = ..., learners: _Optional[_Iterable[str]] = ..., header: _Optional[_Union[Header, _Mapping]] = ...) -> None: ...

class IntroduceRequest(_message.Message):
    __slots__ = ("cluster_id", "node_id", "member_id")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    node_id: str
    member_id: str
    def __init__(self, cluster_id: _Optional[str] = ..., node_id: _Optional[str] = ..., member_id: _Optional[str] = ...) -> None: ...

class IntroduceResponse(_message.Message):
    __slots__ = ("verdict", "message", "is_voter", "is_learner", "last_index", "cluster_id", "node_id")
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    IS_VOTER_FIELD_NUMBER: _ClassVar[int]
    IS_LEARNER_FIELD_NUMBER: _ClassVar[int]
    LAST_INDEX_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    verdict: str
    message: str
    is_voter: bool
    is_learner: bool
    last_index: int
    cluster_id: str
    node_id: str
    def __init__(self, verdict: _Optional[str] = ..., message: _Optional[str] = ..., is_voter: _Optional[bool] = ..., is_learner: _Optional[bool] = ..., last_index: _Optional[int] = ..., cluster_id: _Optional[str] = ..., node_id: _Optional[str] = ...) -> None: ...

class SessionRequest(_message.Message):
    __slots__ = ("seq", "timeout_ms", "put", "get", "delete", "batch")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    PUT_FIELD_NUMBER: _ClassVar[int]
    GET_FIELD_NUMBER: _ClassVar[int]
    DELETE_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    seq: int
    timeout_ms: int
    put: PutRequest
    get: GetRequest
    delete: DeleteRequest
    batch: SessionBatch
    def __init__(self, seq: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., put: _Optional[_Union[PutRequest, _Mapping]] = ..., get: _Optional[_Union[GetRequest, _Mapping]] = ..., delete: _Optional[_Union[DeleteRequest, _Mapping]] = ..., batch: _Optional[_Union[SessionBatch, _Mapping]] = ...) -> None: ...

class SessionBatch(_message.Message):
    __slots__ = ("frames",)
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    frames: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, frames: _Optional[_Iterable[bytes]] = ...) -> None: ...

class SessionError(_message.Message):
    __slots__ = ("code", "message", "outcome", "leader_id", "leader_address")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    outcome: str
    leader_id: str
    leader_address: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., outcome: _Optional[str] = ..., leader_id: _Optional[str] = ..., leader_address: _Optional[str] = ...) -> None: ...

class SessionResponse(_message.Message):
    __slots__ = ("seq", "put", "get", "delete", "error", "batch")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    PUT_FIELD_NUMBER: _ClassVar[int]
    GET_FIELD_NUMBER: _ClassVar[int]
    DELETE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    seq: int
    put: PutResponse
    get: GetResponse
    delete: DeleteResponse
    error: SessionError
    batch: SessionBatch
    def __init__(self, seq: _Optional[int] = ..., put: _Optional[_Union[PutResponse, _Mapping]] = ..., get: _Optional[_Union[GetResponse, _Mapping]] = ..., delete: _Optional[_Union[DeleteResponse, _Mapping]] = ..., error: _Optional[_Union[SessionError, _Mapping]] = ..., batch: _Optional[_Union[SessionBatch, _Mapping]] = ...) -> None: ...
