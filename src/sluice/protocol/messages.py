"""Request and response body schemas of the Kafka APIs Sluice speaks.

Each schema is transcribed from the corresponding Kafka message spec into the ``schema`` DSL:
same field names, order, types, version ranges, nullable and tagged versions, and defaults.
Only the versions Sluice supports (the v2 record-batch era) are declared valid; fields that
exist only outside those versions are left out.

``REQUESTS`` and ``RESPONSES`` map an API key to its schema.
"""

from __future__ import annotations

from sluice.protocol.schema import Field, Message

__all__ = [
    "ADD_OFFSETS_TO_TXN_REQUEST",
    "ADD_OFFSETS_TO_TXN_RESPONSE",
    "ADD_PARTITIONS_TO_TXN_REQUEST",
    "ADD_PARTITIONS_TO_TXN_RESPONSE",
    "ALTER_CONFIGS_REQUEST",
    "ALTER_CONFIGS_RESPONSE",
    "ALTER_PARTITION_REASSIGNMENTS_REQUEST",
    "ALTER_PARTITION_REASSIGNMENTS_RESPONSE",
    "ALTER_USER_SCRAM_CREDENTIALS_REQUEST",
    "ALTER_USER_SCRAM_CREDENTIALS_RESPONSE",
    "API_VERSIONS_REQUEST",
    "API_VERSIONS_RESPONSE",
    "CREATE_ACLS_REQUEST",
    "CREATE_ACLS_RESPONSE",
    "CREATE_PARTITIONS_REQUEST",
    "CREATE_PARTITIONS_RESPONSE",
    "CREATE_TOPICS_REQUEST",
    "CREATE_TOPICS_RESPONSE",
    "DELETE_ACLS_REQUEST",
    "DELETE_ACLS_RESPONSE",
    "DELETE_GROUPS_REQUEST",
    "DELETE_GROUPS_RESPONSE",
    "DELETE_RECORDS_REQUEST",
    "DELETE_RECORDS_RESPONSE",
    "DELETE_TOPICS_REQUEST",
    "DELETE_TOPICS_RESPONSE",
    "DESCRIBE_ACLS_REQUEST",
    "DESCRIBE_ACLS_RESPONSE",
    "DESCRIBE_CLUSTER_REQUEST",
    "DESCRIBE_CLUSTER_RESPONSE",
    "DESCRIBE_CONFIGS_REQUEST",
    "DESCRIBE_CONFIGS_RESPONSE",
    "DESCRIBE_GROUPS_REQUEST",
    "DESCRIBE_GROUPS_RESPONSE",
    "DESCRIBE_LOG_DIRS_REQUEST",
    "DESCRIBE_LOG_DIRS_RESPONSE",
    "DESCRIBE_PRODUCERS_REQUEST",
    "DESCRIBE_PRODUCERS_RESPONSE",
    "DESCRIBE_USER_SCRAM_CREDENTIALS_REQUEST",
    "DESCRIBE_USER_SCRAM_CREDENTIALS_RESPONSE",
    "ELECT_LEADERS_REQUEST",
    "ELECT_LEADERS_RESPONSE",
    "END_TXN_REQUEST",
    "END_TXN_RESPONSE",
    "FETCH_REQUEST",
    "FETCH_RESPONSE",
    "FIND_COORDINATOR_REQUEST",
    "FIND_COORDINATOR_RESPONSE",
    "HEARTBEAT_REQUEST",
    "HEARTBEAT_RESPONSE",
    "INCREMENTAL_ALTER_CONFIGS_REQUEST",
    "INCREMENTAL_ALTER_CONFIGS_RESPONSE",
    "INIT_PRODUCER_ID_REQUEST",
    "INIT_PRODUCER_ID_RESPONSE",
    "JOIN_GROUP_REQUEST",
    "JOIN_GROUP_RESPONSE",
    "LEAVE_GROUP_REQUEST",
    "LEAVE_GROUP_RESPONSE",
    "LIST_GROUPS_REQUEST",
    "LIST_GROUPS_RESPONSE",
    "LIST_OFFSETS_REQUEST",
    "LIST_OFFSETS_RESPONSE",
    "LIST_PARTITION_REASSIGNMENTS_REQUEST",
    "LIST_PARTITION_REASSIGNMENTS_RESPONSE",
    "METADATA_REQUEST",
    "METADATA_RESPONSE",
    "OFFSET_COMMIT_REQUEST",
    "OFFSET_COMMIT_RESPONSE",
    "OFFSET_DELETE_REQUEST",
    "OFFSET_DELETE_RESPONSE",
    "OFFSET_FETCH_REQUEST",
    "OFFSET_FETCH_RESPONSE",
    "OFFSET_FOR_LEADER_EPOCH_REQUEST",
    "OFFSET_FOR_LEADER_EPOCH_RESPONSE",
    "PRODUCE_REQUEST",
    "PRODUCE_RESPONSE",
    "REQUESTS",
    "RESPONSES",
    "SASL_AUTHENTICATE_REQUEST",
    "SASL_AUTHENTICATE_RESPONSE",
    "SASL_HANDSHAKE_REQUEST",
    "SASL_HANDSHAKE_RESPONSE",
    "SYNC_GROUP_REQUEST",
    "SYNC_GROUP_RESPONSE",
    "TXN_OFFSET_COMMIT_REQUEST",
    "TXN_OFFSET_COMMIT_RESPONSE",
    "WRITE_TXN_MARKERS_REQUEST",
    "WRITE_TXN_MARKERS_RESPONSE",
]

#: A broker's address in Produce (v10+) and Fetch (v16+) answers that name a new leader (KIP-951).
_NODE_ENDPOINT = [
    Field("NodeId", "int32", "0+"),
    Field("Host", "string", "0+"),
    Field("Port", "int32", "0+"),
    Field("Rack", "string", "0+", nullable="0+", default="null"),
]

PRODUCE_REQUEST = Message(
    "ProduceRequest",
    0,
    valid="3-10",
    flexible="9+",
    fields=[
        Field("TransactionalId", "string", "3+", nullable="3+", default="null"),
        Field("Acks", "int16", "0+"),
        Field("TimeoutMs", "int32", "0+"),
        Field(
            "TopicData",
            "[]TopicProduceData",
            "0+",
            fields=[
                Field("Name", "string", "0+"),
                Field(
                    "PartitionData",
                    "[]PartitionProduceData",
                    "0+",
                    fields=[
                        Field("Index", "int32", "0+"),
                        Field("Records", "records", "0+", nullable="0+"),
                    ],
                ),
            ],
        ),
    ],
)

PRODUCE_RESPONSE = Message(
    "ProduceResponse",
    0,
    valid="3-10",
    flexible="9+",
    fields=[
        Field(
            "Responses",
            "[]TopicProduceResponse",
            "0+",
            fields=[
                Field("Name", "string", "0+"),
                Field(
                    "PartitionResponses",
                    "[]PartitionProduceResponse",
                    "0+",
                    fields=[
                        Field("Index", "int32", "0+"),
                        Field("ErrorCode", "int16", "0+"),
                        Field("BaseOffset", "int64", "0+"),
                        Field("LogAppendTimeMs", "int64", "2+", default="-1", ignorable=True),
                        Field("LogStartOffset", "int64", "5+", default="-1", ignorable=True),
                        Field(
                            "RecordErrors",
                            "[]BatchIndexAndErrorMessage",
                            "8+",
                            ignorable=True,
                            fields=[
                                Field("BatchIndex", "int32", "8+"),
                                Field(
                                    "BatchIndexErrorMessage", "string", "8+", nullable="8+", default="null"
                                ),
                            ],
                        ),
                        Field("ErrorMessage", "string", "8+", nullable="8+", default="null", ignorable=True),
                        Field(
                            "CurrentLeader",
                            "LeaderIdAndEpoch",
                            "10+",
                            tagged="10+",
                            tag=0,
                            fields=[
                                Field("LeaderId", "int32", "10+", default="-1"),
                                Field("LeaderEpoch", "int32", "10+", default="-1"),
                            ],
                        ),
                    ],
                ),
            ],
        ),
        Field("ThrottleTimeMs", "int32", "1+", default="0", ignorable=True),
        Field(
            "NodeEndpoints",
            "[]NodeEndpoint",
            "10+",
            tagged="10+",
            tag=0,
            fields=_NODE_ENDPOINT,
        ),
    ],
)

FETCH_REQUEST = Message(
    "FetchRequest",
    1,
    valid="4-16",
    flexible="12+",
    fields=[
        Field(
            "ClusterId", "string", "12+", nullable="12+", tagged="12+", tag=0, default="null", ignorable=True
        ),
        Field("ReplicaId", "int32", "0-14", default="-1"),
        Field(
            "ReplicaState",
            "ReplicaState",
            "15+",
            tagged="15+",
            tag=1,
            fields=[
                Field("ReplicaId", "int32", "15+", default="-1"),
                Field("ReplicaEpoch", "int64", "15+", default="-1"),
            ],
        ),
        Field("MaxWaitMs", "int32", "0+"),
        Field("MinBytes", "int32", "0+"),
        Field("MaxBytes", "int32", "3+", default="0x7fffffff", ignorable=True),
        Field("IsolationLevel", "int8", "4+", default="0", ignorable=True),
        Field("SessionId", "int32", "7+", default="0", ignorable=True),
        Field("SessionEpoch", "int32", "7+", default="-1", ignorable=True),
        Field(
            "Topics",
            "[]FetchTopic",
            "0+",
            fields=[
                Field("Topic", "string", "0-12", ignorable=True),
                Field("TopicId", "uuid", "13+", ignorable=True),
                Field(
                    "Partitions",
                    "[]FetchPartition",
                    "0+",
                    fields=[
                        Field("Partition", "int32", "0+"),
                        Field("CurrentLeaderEpoch", "int32", "9+", default="-1", ignorable=True),
                        Field("FetchOffset", "int64", "0+"),
                        Field("LastFetchedEpoch", "int32", "12+", default="-1"),
                        Field("LogStartOffset", "int64", "5+", default="-1", ignorable=True),
                        Field("PartitionMaxBytes", "int32", "0+"),
                    ],
                ),
            ],
        ),
        Field(
            "ForgottenTopicsData",
            "[]ForgottenTopic",
            "7+",
            fields=[
                Field("Topic", "string", "7-12", ignorable=True),
                Field("TopicId", "uuid", "13+", ignorable=True),
                Field("Partitions", "[]int32", "7+"),
            ],
        ),
        Field("RackId", "string", "11+", default="", ignorable=True),
    ],
)

FETCH_RESPONSE = Message(
    "FetchResponse",
    1,
    valid="4-16",
    flexible="12+",
    fields=[
        Field("ThrottleTimeMs", "int32", "1+", ignorable=True),
        Field("ErrorCode", "int16", "7+", ignorable=True),
        Field("SessionId", "int32", "7+", default="0"),
        Field(
            "Responses",
            "[]FetchableTopicResponse",
            "0+",
            fields=[
                Field("Topic", "string", "0-12", ignorable=True),
                Field("TopicId", "uuid", "13+", ignorable=True),
                Field(
                    "Partitions",
                    "[]PartitionData",
                    "0+",
                    fields=[
                        Field("PartitionIndex", "int32", "0+"),
                        Field("ErrorCode", "int16", "0+"),
                        Field("HighWatermark", "int64", "0+"),
                        Field("LastStableOffset", "int64", "4+", default="-1", ignorable=True),
                        Field("LogStartOffset", "int64", "5+", default="-1", ignorable=True),
                        Field(
                            "DivergingEpoch",
                            "EpochEndOffset",
                            "12+",
                            tagged="12+",
                            tag=0,
                            fields=[
                                Field("Epoch", "int32", "12+", default="-1"),
                                Field("EndOffset", "int64", "12+", default="-1"),
                            ],
                        ),
                        Field(
                            "CurrentLeader",
                            "LeaderIdAndEpoch",
                            "12+",
                            tagged="12+",
                            tag=1,
                            fields=[
                                Field("LeaderId", "int32", "12+", default="-1"),
                                Field("LeaderEpoch", "int32", "12+", default="-1"),
                            ],
                        ),
                        Field(
                            "SnapshotId",
                            "SnapshotId",
                            "12+",
                            tagged="12+",
                            tag=2,
                            fields=[
                                Field("EndOffset", "int64", "0+", default="-1"),
                                Field("Epoch", "int32", "0+", default="-1"),
                            ],
                        ),
                        Field(
                            "AbortedTransactions",
                            "[]AbortedTransaction",
                            "4+",
                            nullable="4+",
                            ignorable=True,
                            fields=[
                                Field("ProducerId", "int64", "4+"),
                                Field("FirstOffset", "int64", "4+"),
                            ],
                        ),
                        Field("PreferredReadReplica", "int32", "11+", default="-1"),
                        Field("Records", "records", "0+", nullable="0+"),
                    ],
                ),
            ],
        ),
        Field("NodeEndpoints", "[]NodeEndpoint", "16+", tagged="16+", tag=0, fields=_NODE_ENDPOINT),
    ],
)

LIST_OFFSETS_REQUEST = Message(
    "ListOffsetsRequest",
    2,
    valid="1-7",
    flexible="6+",
    fields=[
        Field("ReplicaId", "int32", "0+"),
        Field("IsolationLevel", "int8", "2+"),
        Field(
            "Topics",
            "[]ListOffsetsTopic",
            "0+",
            fields=[
                Field("Name", "string", "0+"),
                Field(
                    "Partitions",
                    "[]ListOffsetsPartition",
                    "0+",
                    fields=[
                        Field("PartitionIndex", "int32", "0+"),
                        Field("CurrentLeaderEpoch", "int32", "4+", default="-1", ignorable=True),
                        Field("Timestamp", "int64", "0+"),
                    ],
                ),
            ],
        ),
    ],
)

LIST_OFFSETS_RESPONSE = Message(
    "ListOffsetsResponse",
    2,
    valid="1-7",
    flexible="6+",
    fields=[
        Field("ThrottleTimeMs", "int32", "2+", ignorable=True),
        Field(
            "Topics",
            "[]ListOffsetsTopicResponse",
            "0+",
            fields=[
                Field("Name", "string", "0+"),
                Field(
                    "Partitions",
                    "[]ListOffsetsPartitionResponse",
                    "0+",
                    fields=[
                        Field("PartitionIndex", "int32", "0+"),
                        Field("ErrorCode", "int16", "0+"),
                        Field("Timestamp", "int64", "1+", default="-1"),
                        Field("Offset", "int64", "1+", default="-1"),
                        Field("LeaderEpoch", "int32", "4+", default="-1"),
                    ],
                ),
            ],
        ),
    ],
)

METADATA_REQUEST = Message(
    "MetadataRequest",
    3,
    valid="1-12",
    flexible="9+",
    fields=[
        Field(
            "Topics",
            "[]MetadataRequestTopic",
            "0+",
            nullable="1+",
            fields=[
                Field("TopicId", "uuid", "10+", ignorable=True),
                Field("Name", "string", "0+", nullable="10+"),
            ],
        ),
        Field("AllowAutoTopicCreation", "bool", "4+", default="true"),
        Field("IncludeClusterAuthorizedOperations", "bool", "8-10"),
        Field("IncludeTopicAuthorizedOperations", "bool", "8+"),
    ],
)

METADATA_RESPONSE = Message(
    "MetadataResponse",
    3,
    valid="1-12",
    flexible="9+",
    fields=[
        Field("ThrottleTimeMs", "int32", "3+", ignorable=True),
        Field(
            "Brokers",
            "[]MetadataResponseBroker",
            "0+",
            fields=[
                Field("NodeId", "int32", "0+"),
                Field("Host", "string", "0+"),
                Field("Port", "int32", "0+"),
                Field("Rack", "string", "1+", nullable="1+", default="null", ignorable=True),
            ],
        ),
        Field("ClusterId", "string", "2+", nullable="2+", default="null", ignorable=True),
        Field("ControllerId", "int32", "1+", default="-1", ignorable=True),
        Field(
            "Topics",
            "[]MetadataResponseTopic",
            "0+",
            fields=[
                Field("ErrorCode", "int16", "0+"),
                Field("Name", "string", "0+", nullable="12+"),
                Field("TopicId", "uuid", "10+", ignorable=True),
                Field("IsInternal", "bool", "1+", default="false", ignorable=True),
                Field(
                    "Partitions",
                    "[]MetadataResponsePartition",
                    "0+",
                    fields=[
                        Field("ErrorCode", "int16", "0+"),
                        Field("PartitionIndex", "int32", "0+"),
                        Field("LeaderId", "int32", "0+"),
                        Field("LeaderEpoch", "int32", "7+", default="-1", ignorable=True),
                        Field("ReplicaNodes", "[]int32", "0+"),
                        Field("IsrNodes", "[]int32", "0+"),
                        Field("OfflineReplicas", "[]int32", "5+", ignorable=True),
                    ],
                ),
                Field("TopicAuthorizedOperations", "int32", "8+", default="-2147483648"),
            ],
        ),
        Field("ClusterAuthorizedOperations", "int32", "8-10", default="-2147483648"),
    ],
)

OFFSET_COMMIT_REQUEST = Message(
    "OffsetCommitRequest",
    8,
    valid="2-8",
    flexible="8+",
    fields=[
        Field("GroupId", "string", "0+"),
        Field("GenerationIdOrMemberEpoch", "int32", "1+", default="-1", ignorable=True),
        Field("MemberId", "string", "1+", ignorable=True),
        Field("GroupInstanceId", "string", "7+", nullable="7+", default="null"),
        Field("RetentionTimeMs", "int64", "2-4", default="-1", ignorable=True),
        Field(
            "Topics",
            "[]OffsetCommitRequestTopic",
            "0+",
            fields=[
                Field("Name", "string", "0+"),
                Field(
                    "Partitions",
                    "[]OffsetCommitRequestPartition",
                    "0+",
                    fields=[
                        Field("PartitionIndex", "int32", "0+"),
                        Field("CommittedOffset", "int64", "0+"),
                        Field("CommittedLeaderEpoch", "int32", "6+", default="-1", ignorable=True),
                        Field("CommittedMetadata", "string", "0+", nullable="0+"),
                    ],
                ),
            ],
        ),
    ],
)

OFFSET_COMMIT_RESPONSE = Message(
    "OffsetCommitResponse",
    8,
    valid="2-8",
    flexible="8+",
    fields=[
        Field("ThrottleTimeMs", "int32", "3+", ignorable=True),
        Field(
            "Topics",
            "[]OffsetCommitResponseTopic",
            "0+",
            fields=[
                Field("Name", "string", "0+"),
                Field(
                    "Partitions",
                    "[]OffsetCommitResponsePartition",
                    "0+",
                    fields=[
                        Field("PartitionIndex", "int32", "0+"),
                        Field("ErrorCode", "int16", "0+"),
                    ],
                ),
            ],
        ),
    ],
)

OFFSET_FETCH_REQUEST = Message(
    "OffsetFetchRequest",
    9,
    valid="1-7",
    flexible="6+",
    fields=[
        Field("GroupId", "string", "0-7"),
        Field(
            "Topics",
            "[]OffsetFetchRequestTopic",
            "0-7",
            nullable="2-7",
            fields=[
                Field("Name", "string", "0-7"),
                Field("PartitionIndexes", "[]int32", "0-7"),
            ],
        ),
        Field("RequireStable", "bool", "7+", default="false"),
    ],
)

OFFSET_FETCH_RESPONSE = Message(
    "OffsetFetchResponse",
    9,
    valid="1-7",
    flexible="6+",
    fields=[
        Field("ThrottleTimeMs", "int32", "3+", ignorable=True),
        Field(
            "Topics",
            "[]OffsetFetchResponseTopic",
            "0-7",
            fields=[
                Field("Name", "string", "0-7"),
                Field(
                    "Partitions",
                    "[]OffsetFetchResponsePartition",
                    "0-7",
                    fields=[
                        Field("PartitionIndex", "int32", "0-7"),
                        Field("CommittedOffset", "int64", "0-7"),
                        Field("CommittedLeaderEpoch", "int32", "5-7", default="-1", ignorable=True),
                        Field("Metadata", "string", "0-7", nullable="0-7"),
                        Field("ErrorCode", "int16", "0-7"),
                    ],
                ),
            ],
        ),
        Field("ErrorCode", "int16", "2-7", default="0", ignorable=True),
    ],
)

FIND_COORDINATOR_REQUEST = Message(
    "FindCoordinatorRequest",
    10,
    valid="0-4",
    flexible="3+",
    fields=[
        Field("Key", "string", "0-3"),
        Field("KeyType", "int8", "1+", default="0"),
        Field("CoordinatorKeys", "[]string", "4+"),
    ],
)

FIND_COORDINATOR_RESPONSE = Message(
    "FindCoordinatorResponse",
    10,
    valid="0-4",
    flexible="3+",
    fields=[
        Field("ThrottleTimeMs", "int32", "1+", ignorable=True),
        Field("ErrorCode", "int16", "0-3"),
        Field("ErrorMessage", "string", "1-3", nullable="1-3", ignorable=True),
        Field("NodeId", "int32", "0-3"),
        Field("Host", "string", "0-3"),
        Field("Port", "int32", "0-3"),
        Field(
            "Coordinators",
            "[]Coordinator",
            "4+",
            fields=[
                Field("Key", "string", "4+"),
                Field("NodeId", "int32", "4+"),
                Field("Host", "string", "4+"),
                Field("Port", "int32", "4+"),
                Field("ErrorCode", "int16", "4+"),
                Field("ErrorMessage", "string", "4+", nullable="4+", ignorable=True),
            ],
        ),
    ],
)

JOIN_GROUP_REQUEST = Message(
    "JoinGroupRequest",
    11,
    valid="0-9",
    flexible="6+",
    fields=[
        Field("GroupId", "string", "0+"),
        Field("SessionTimeoutMs", "int32", "0+"),
        Field("RebalanceTimeoutMs", "int32", "1+", default="-1", ignorable=True),
        Field("MemberId", "string", "0+"),
        Field("GroupInstanceId", "string", "5+", nullable="5+", default="null"),
        Field("ProtocolType", "string", "0+"),
        Field(
            "Protocols",
            "[]JoinGroupRequestProtocol",
            "0+",
            fields=[
                Field("Name", "string", "0+"),
                Field("Metadata", "bytes", "0+"),
            ],
        ),
        Field("Reason", "string", "8+", nullable="8+", default="null", ignorable=True),
    ],
)

JOIN_GROUP_RESPONSE = Message(
    "JoinGroupResponse",
    11,
    valid="0-9",
    flexible="6+",
    fields=[
        Field("ThrottleTimeMs", "int32", "2+", ignorable=True),
        Field("ErrorCode", "int16", "0+"),
        Field("GenerationId", "int32", "0+", default="-1"),
        Field("ProtocolType", "string", "7+", nullable="7+", default="null", ignorable=True),
        Field("ProtocolName", "string", "0+", nullable="7+"),
        Field("Leader", "string", "0+"),
        Field("SkipAssignment", "bool", "9+", default="false"),
        Field("MemberId", "string", "0+"),
        Field(
            "Members",
            "[]JoinGroupResponseMember",
            "0+",
            fields=[
                Field("MemberId", "string", "0+"),
                Field("GroupInstanceId", "string", "5+", nullable="5+", default="null", ignorable=True),
                Field("Metadata", "bytes", "0+"),
            ],
        ),
    ],
)

HEARTBEAT_REQUEST = Message(
    "HeartbeatRequest",
    12,
    valid="0-4",
    flexible="4+",
    fields=[
        Field("GroupId", "string", "0+"),
        Field("GenerationId", "int32", "0+"),
        Field("MemberId", "string", "0+"),
        Field("GroupInstanceId", "string", "3+", nullable="3+", default="null"),
    ],
)

HEARTBEAT_RESPONSE = Message(
    "HeartbeatResponse",
    12,
    valid="0-4",
    flexible="4+",
    fields=[
        Field("ThrottleTimeMs", "int32", "1+", ignorable=True),
        Field("ErrorCode", "int16", "0+"),
    ],
)

LEAVE_GROUP_REQUEST = Message(
    "LeaveGroupRequest",
    13,
    valid="0-5",
    flexible="4+",
    fields=[
        Field("GroupId", "string", "0+"),
        Field("MemberId", "string", "0-2"),
        Field(
            "Members",
            "[]MemberIdentity",
            "3+",
            fields=[
                Field("MemberId", "string", "3+"),
                Field("GroupInstanceId", "string", "3+", nullable="3+", default="null"),
                Field("Reason", "string", "5+", nullable="5+", default="null", ignorable=True),
            ],
        ),
    ],
)

LEAVE_GROUP_RESPONSE = Message(
    "LeaveGroupResponse",
    13,
    valid="0-5",
    flexible="4+",
    fields=[
        Field("ThrottleTimeMs", "int32", "1+", ignorable=True),
        Field("ErrorCode", "int16", "0+"),
        Field(
            "Members",
            "[]MemberResponse",
            "3+",
            fields=[
                Field("MemberId", "string", "3+"),
                Field("GroupInstanceId", "string", "3+", nullable="3+"),
                Field("ErrorCode", "int16", "3+"),
            ],
        ),
    ],
)

SYNC_GROUP_REQUEST = Message(
    "SyncGroupRequest",
    14,
    valid="0-5",
    flexible="4+",
    fields=[
        Field("GroupId", "string", "0+"),
        Field("GenerationId", "int32", "0+"),
        Field("MemberId", "string", "0+"),
        Field("GroupInstanceId", "string", "3+", nullable="3+", default="null"),
        Field("ProtocolType", "string", "5+", nullable="5+", default="null", ignorable=True),
        Field("ProtocolName", "string", "5+", nullable="5+", default="null", ignorable=True),
        Field(
            "Assignments",
            "[]SyncGroupRequestAssignment",
            "0+",
            fields=[
                Field("MemberId", "string", "0+"),
                Field("Assignment", "bytes", "0+"),
            ],
        ),
    ],
)

SYNC_GROUP_RESPONSE = Message(
    "SyncGroupResponse",
    14,
    valid="0-5",
    flexible="4+",
    fields=[
        Field("ThrottleTimeMs", "int32", "1+", ignorable=True),
        Field("ErrorCode", "int16", "0+"),
        Field("ProtocolType", "string", "5+", nullable="5+", default="null", ignorable=True),
        Field("ProtocolName", "string", "5+", nullable="5+", default="null", ignorable=True),
        Field("Assignment", "bytes", "0+"),
    ],
)

DESCRIBE_GROUPS_REQUEST = Message(
    "DescribeGroupsRequest",
    15,
    valid="0-5",
    flexible="5+",
    fields=[
        Field("Groups", "[]string", "0+"),
        Field("IncludeAuthorizedOperations", "bool", "3+"),
    ],
)

DESCRIBE_GROUPS_RESPONSE = Message(
    "DescribeGroupsResponse",
    15,
    valid="0-5",
    flexible="5+",
    fields=[
        Field("ThrottleTimeMs", "int32", "1+", ignorable=True),
        Field(
            "Groups",
            "[]DescribedGroup",
            "0+",
            fields=[
                Field("ErrorCode", "int16", "0+"),
                Field("GroupId", "string", "0+"),
                Field("GroupState", "string", "0+"),
                Field("ProtocolType", "string", "0+"),
                Field("ProtocolData", "string", "0+"),
                Field(
                    "Members",
                    "[]DescribedGroupMember",
                    "0+",
                    fields=[
                        Field("MemberId", "string", "0+"),
                        Field(
                            "GroupInstanceId", "string", "4+", nullable="4+", default="null", ignorable=True
                        ),
                        Field("ClientId", "string", "0+"),
                        Field("ClientHost", "string", "0+"),
                        Field("MemberMetadata", "bytes", "0+"),
                        Field("MemberAssignment", "bytes", "0+"),
                    ],
                ),
                Field("AuthorizedOperations", "int32", "3+", default="-2147483648"),
            ],
        ),
    ],
)

LIST_GROUPS_REQUEST = Message(
    "ListGroupsRequest",
    16,
    valid="0-4",
    flexible="3+",
    fields=[
        Field("StatesFilter", "[]string", "4+"),
    ],
)

LIST_GROUPS_RESPONSE = Message(
    "ListGroupsResponse",
    16,
    valid="0-4",
    flexible="3+",
    fields=[
        Field("ThrottleTimeMs", "int32", "1+", ignorable=True),
        Field("ErrorCode", "int16", "0+"),
        Field(
            "Groups",
            "[]ListedGroup",
            "0+",
            fields=[
                Field("GroupId", "string", "0+"),
                Field("ProtocolType", "string", "0+"),
                Field("GroupState", "string", "4+", ignorable=True),
            ],
        ),
    ],
)

API_VERSIONS_REQUEST = Message(
    "ApiVersionsRequest",
    18,
    valid="0-3",
    flexible="3+",
    fields=[
        Field("ClientSoftwareName", "string", "3+", ignorable=True),
        Field("ClientSoftwareVersion", "string", "3+", ignorable=True),
    ],
)

API_VERSIONS_RESPONSE = Message(
    "ApiVersionsResponse",
    18,
    valid="0-3",
    flexible="3+",
    fields=[
        Field("ErrorCode", "int16", "0+"),
        Field(
            "ApiKeys",
            "[]ApiVersion",
            "0+",
            fields=[
                Field("ApiKey", "int16", "0+"),
                Field("MinVersion", "int16", "0+"),
                Field("MaxVersion", "int16", "0+"),
            ],
        ),
        Field("ThrottleTimeMs", "int32", "1+", ignorable=True),
        Field(
            "SupportedFeatures",
            "[]SupportedFeatureKey",
            "3+",
            tagged="3+",
            tag=0,
            ignorable=True,
            fields=[
                Field("Name", "string", "3+"),
                Field("MinVersion", "int16", "3+"),
                Field("MaxVersion", "int16", "3+"),
            ],
        ),
        Field("FinalizedFeaturesEpoch", "int64", "3+", tagged="3+", tag=1, default="-1", ignorable=True),
        Field(
            "FinalizedFeatures",
            "[]FinalizedFeatureKey",
            "3+",
            tagged="3+",
            tag=2,
            ignorable=True,
            fields=[
                Field("Name", "string", "3+"),
                Field("MaxVersionLevel", "int16", "3+"),
                Field("MinVersionLevel", "int16", "3+"),
            ],
        ),
        Field("ZkMigrationReady", "bool", "3+", tagged="3+", tag=3, default="false", ignorable=True),
    ],
)

CREATE_TOPICS_REQUEST = Message(
    "CreateTopicsRequest",
    19,
    valid="2-7",
    flexible="5+",
    fields=[
        Field(
            "Topics",
            "[]CreatableTopic",
            "0+",
            fields=[
                Field("Name", "string", "0+"),
                Field("NumPartitions", "int32", "0+"),
                Field("ReplicationFactor", "int16", "0+"),
                Field(
                    "Assignments",
                    "[]CreatableReplicaAssignment",
                    "0+",
                    fields=[
                        Field("PartitionIndex", "int32", "0+"),
                        Field("BrokerIds", "[]int32", "0+"),
                    ],
                ),
                Field(
                    "Configs",
                    "[]CreatableTopicConfig",
                    "0+",
                    fields=[
                        Field("Name", "string", "0+"),
                        Field("Value", "string", "0+", nullable="0+"),
                    ],
                ),
            ],
        ),
        Field("timeoutMs", "int32", "0+", default="60000"),
        Field("validateOnly", "bool", "1+", default="false"),
    ],
)

CREATE_TOPICS_RESPONSE = Message(
    "CreateTopicsResponse",
    19,
    valid="2-7",
    flexible="5+",
    fields=[
        Field("ThrottleTimeMs", "int32", "2+", ignorable=True),
        Field(
            "Topics",
            "[]CreatableTopicResult",
            "0+",
            fields=[
                Field("Name", "string", "0+"),
                Field("TopicId", "uuid", "7+", ignorable=True),
                Field("ErrorCode", "int16", "0+"),
                Field("ErrorMessage", "string", "1+", nullable="0+", ignorable=True),
                Field("TopicConfigErrorCode", "int16", "5+", tagged="5+", tag=0, ignorable=True),
                Field("NumPartitions", "int32", "5+", default="-1", ignorable=True),
                Field("ReplicationFactor", "int16", "5+", default="-1", ignorable=True),
                Field(
                    "Configs",
                    "[]CreatableTopicConfigs",
                    "5+",
                    nullable="5+",
                    ignorable=True,
                    fields=[
                        Field("Name", "string", "5+"),
                        Field("Value", "string", "5+", nullable="5+"),
                        Field("ReadOnly", "bool", "5+"),
                        Field("ConfigSource", "int8", "5+", default="-1", ignorable=True),
                        Field("IsSensitive", "bool", "5+"),
                    ],
                ),
            ],
        ),
    ],
)

DELETE_TOPICS_REQUEST = Message(
    "DeleteTopicsRequest",
    20,
    valid="1-6",
    flexible="4+",
    fields=[
        Field(
            "Topics",
            "[]DeleteTopicState",
            "6+",
            fields=[
                Field("Name", "string", "6+", nullable="6+", default="null"),
                Field("TopicId", "uuid", "6+"),
            ],
        ),
        Field("TopicNames", "[]string", "0-5", ignorable=True),
        Field("TimeoutMs", "int32", "0+"),
    ],
)

DELETE_TOPICS_RESPONSE = Message(
    "DeleteTopicsResponse",
    20,
    valid="1-6",
    flexible="4+",
    fields=[
        Field("ThrottleTimeMs", "int32", "1+", ignorable=True),
        Field(
            "Responses",
            "[]DeletableTopicResult",
            "0+",
            fields=[
                Field("Name", "string", "0+", nullable="6+"),
                Field("TopicId", "uuid", "6+", ignorable=True),
                Field("ErrorCode", "int16", "0+"),
                Field("ErrorMessage", "string", "5+", nullable="5+", default="null", ignorable=True),
            ],
        ),
    ],
)

INIT_PRODUCER_ID_REQUEST = Message(
    "InitProducerIdRequest",
    22,
    valid="0-4",
    flexible="2+",
    fields=[
        Field("TransactionalId", "string", "0+", nullable="0+"),
        Field("TransactionTimeoutMs", "int32", "0+"),
        Field("ProducerId", "int64", "3+", default="-1"),
        Field("ProducerEpoch", "int16", "3+", default="-1"),
    ],
)

INIT_PRODUCER_ID_RESPONSE = Message(
    "InitProducerIdResponse",
    22,
    valid="0-4",
    flexible="2+",
    fields=[
        Field("ThrottleTimeMs", "int32", "0+", ignorable=True),
        Field("ErrorCode", "int16", "0+"),
        Field("ProducerId", "int64", "0+", default="-1"),
        Field("ProducerEpoch", "int16", "0+"),
    ],
)

OFFSET_FOR_LEADER_EPOCH_REQUEST = Message(
    "OffsetForLeaderEpochRequest",
    23,
    valid="2-4",
    flexible="4+",
    fields=[
        Field("ReplicaId", "int32", "3+", default="-2", ignorable=True),
        Field(
            "Topics",
            "[]OffsetForLeaderTopic",
            "0+",
            fields=[
                Field("Topic", "string", "0+"),
                Field(
                    "Partitions",
                    "[]OffsetForLeaderPartition",
                    "0+",
                    fields=[
                        Field("Partition", "int32", "0+"),
                        Field("CurrentLeaderEpoch", "int32", "2+", default="-1", ignorable=True),
                        Field("LeaderEpoch", "int32", "0+"),
                    ],
                ),
            ],
        ),
    ],
)

OFFSET_FOR_LEADER_EPOCH_RESPONSE = Message(
    "OffsetForLeaderEpochResponse",
    23,
    valid="2-4",
    flexible="4+",
    fields=[
        Field("ThrottleTimeMs", "int32", "2+", ignorable=True),
        Field(
            "Topics",
            "[]OffsetForLeaderTopicResult",
            "0+",
            fields=[
                Field("Topic", "string", "0+"),
                Field(
                    "Partitions",
                    "[]EpochEndOffset",
                    "0+",
                    fields=[
                        Field("ErrorCode", "int16", "0+"),
                        Field("Partition", "int32", "0+"),
                        Field("LeaderEpoch", "int32", "1+", default="-1", ignorable=True),
                        Field("EndOffset", "int64", "0+", default="-1"),
                    ],
                ),
            ],
        ),
    ],
)

# The ACL APIs (KIP-140; v1 adds pattern types, KIP-290). Codes of resource types, pattern types,
# operations and permissions are those of sluice.security.acl.
DESCRIBE_ACLS_REQUEST = Message(
    "DescribeAclsRequest",
    29,
    valid="0-3",
    flexible="2+",
    fields=[
        Field("ResourceTypeFilter", "int8", "0+"),
        Field("ResourceNameFilter", "string", "0+", nullable="0+"),
        Field("PatternTypeFilter", "int8", "1+", default="3"),
        Field("PrincipalFilter", "string", "0+", nullable="0+"),
        Field("HostFilter", "string", "0+", nullable="0+"),
        Field("Operation", "int8", "0+"),
        Field("PermissionType", "int8", "0+"),
    ],
)

DESCRIBE_ACLS_RESPONSE = Message(
    "DescribeAclsResponse",
    29,
    valid="0-3",
    flexible="2+",
    fields=[
        Field("ThrottleTimeMs", "int32", "0+"),
        Field("ErrorCode", "int16", "0+"),
        Field("ErrorMessage", "string", "0+", nullable="0+"),
        Field(
            "Resources",
            "[]DescribeAclsResource",
            "0+",
            fields=[
                Field("ResourceType", "int8", "0+"),
                Field("ResourceName", "string", "0+"),
                Field("PatternType", "int8", "1+", default="3"),
                Field(
                    "Acls",
                    "[]AclDescription",
                    "0+",
                    fields=[
                        Field("Principal", "string", "0+"),
                        Field("Host", "string", "0+"),
                        Field("Operation", "int8", "0+"),
                        Field("PermissionType", "int8", "0+"),
                    ],
                ),
            ],
        ),
    ],
)

CREATE_ACLS_REQUEST = Message(
    "CreateAclsRequest",
    30,
    valid="0-3",
    flexible="2+",
    fields=[
        Field(
            "Creations",
            "[]AclCreation",
            "0+",
            fields=[
                Field("ResourceType", "int8", "0+"),
                Field("ResourceName", "string", "0+"),
                Field("ResourcePatternType", "int8", "1+", default="3"),
                Field("Principal", "string", "0+"),
                Field("Host", "string", "0+"),
                Field("Operation", "int8", "0+"),
                Field("PermissionType", "int8", "0+"),
            ],
        ),
    ],
)

CREATE_ACLS_RESPONSE = Message(
    "CreateAclsResponse",
    30,
    valid="0-3",
    flexible="2+",
    fields=[
        Field("ThrottleTimeMs", "int32", "0+"),
        Field(
            "Results",
            "[]AclCreationResult",
            "0+",
            fields=[
                Field("ErrorCode", "int16", "0+"),
                Field("ErrorMessage", "string", "0+", nullable="0+"),
            ],
        ),
    ],
)

DELETE_ACLS_REQUEST = Message(
    "DeleteAclsRequest",
    31,
    valid="0-3",
    flexible="2+",
    fields=[
        Field(
            "Filters",
            "[]DeleteAclsFilter",
            "0+",
            fields=[
                Field("ResourceTypeFilter", "int8", "0+"),
                Field("ResourceNameFilter", "string", "0+", nullable="0+"),
                Field("PatternTypeFilter", "int8", "1+", default="3"),
                Field("PrincipalFilter", "string", "0+", nullable="0+"),
                Field("HostFilter", "string", "0+", nullable="0+"),
                Field("Operation", "int8", "0+"),
                Field("PermissionType", "int8", "0+"),
            ],
        ),
    ],
)

DELETE_ACLS_RESPONSE = Message(
    "DeleteAclsResponse",
    31,
    valid="0-3",
    flexible="2+",
    fields=[
        Field("ThrottleTimeMs", "int32", "0+"),
        Field(
            "FilterResults",
            "[]DeleteAclsFilterResult",
            "0+",
            fields=[
                Field("ErrorCode", "int16", "0+"),
                Field("ErrorMessage", "string", "0+", nullable="0+"),
                Field(
                    "MatchingAcls",
                    "[]DeleteAclsMatchingAcl",
                    "0+",
                    fields=[
                        Field("ErrorCode", "int16", "0+"),
                        Field("ErrorMessage", "string", "0+", nullable="0+"),
                        Field("ResourceType", "int8", "0+"),
                        Field("ResourceName", "string", "0+"),
                        Field("PatternType", "int8", "1+", default="3"),
                        Field("Principal", "string", "0+"),
                        Field("Host", "string", "0+"),
                        Field("Operation", "int8", "0+"),
                        Field("PermissionType", "int8", "0+"),
                    ],
                ),
            ],
        ),
    ],
)

DESCRIBE_CONFIGS_REQUEST = Message(
    "DescribeConfigsRequest",
    32,
    valid="1-4",
    flexible="4+",
    fields=[
        Field(
            "Resources",
            "[]DescribeConfigsResource",
            "0+",
            fields=[
                Field("ResourceType", "int8", "0+"),
                Field("ResourceName", "string", "0+"),
                Field("ConfigurationKeys", "[]string", "0+", nullable="0+"),
            ],
        ),
        Field("IncludeSynonyms", "bool", "1+", default="false"),
        Field("IncludeDocumentation", "bool", "3+", default="false"),
    ],
)

DESCRIBE_CONFIGS_RESPONSE = Message(
    "DescribeConfigsResponse",
    32,
    valid="1-4",
    flexible="4+",
    fields=[
        Field("ThrottleTimeMs", "int32", "0+"),
        Field(
            "Results",
            "[]DescribeConfigsResult",
            "0+",
            fields=[
                Field("ErrorCode", "int16", "0+"),
                Field("ErrorMessage", "string", "0+", nullable="0+"),
                Field("ResourceType", "int8", "0+"),
                Field("ResourceName", "string", "0+"),
                Field(
                    "Configs",
                    "[]DescribeConfigsResourceResult",
                    "0+",
                    fields=[
                        Field("Name", "string", "0+"),
                        Field("Value", "string", "0+", nullable="0+"),
                        Field("ReadOnly", "bool", "0+"),
                        Field("ConfigSource", "int8", "1+", default="-1", ignorable=True),
                        Field("IsSensitive", "bool", "0+"),
                        Field(
                            "Synonyms",
                            "[]DescribeConfigsSynonym",
                            "1+",
                            ignorable=True,
                            fields=[
                                Field("Name", "string", "1+"),
                                Field("Value", "string", "1+", nullable="0+"),
                                Field("Source", "int8", "1+"),
                            ],
                        ),
                        Field("ConfigType", "int8", "3+", default="0", ignorable=True),
                        Field("Documentation", "string", "3+", nullable="0+", ignorable=True),
                    ],
                ),
            ],
        ),
    ],
)

DELETE_GROUPS_REQUEST = Message(
    "DeleteGroupsRequest",
    42,
    valid="0-2",
    flexible="2+",
    fields=[
        Field("GroupsNames", "[]string", "0+"),
    ],
)

DELETE_GROUPS_RESPONSE = Message(
    "DeleteGroupsResponse",
    42,
    valid="0-2",
    flexible="2+",
    fields=[
        Field("ThrottleTimeMs", "int32", "0+"),
        Field(
            "Results",
            "[]DeletableGroupResult",
            "0+",
            fields=[
                Field("GroupId", "string", "0+"),
                Field("ErrorCode", "int16", "0+"),
            ],
        ),
    ],
)


SASL_HANDSHAKE_REQUEST = Message(
    "SaslHandshakeRequest",
    17,
    valid="0-1",
    flexible="none",
    fields=[Field("Mechanism", "string", "0+")],
)

SASL_HANDSHAKE_RESPONSE = Message(
    "SaslHandshakeResponse",
    17,
    valid="0-1",
    flexible="none",
    fields=[Field("ErrorCode", "int16", "0+"), Field("Mechanisms", "[]string", "0+")],
)

SASL_AUTHENTICATE_REQUEST = Message(
    "SaslAuthenticateRequest",
    36,
    valid="0-2",
    flexible="2+",
    fields=[Field("AuthBytes", "bytes", "0+")],
)

SASL_AUTHENTICATE_RESPONSE = Message(
    "SaslAuthenticateResponse",
    36,
    valid="0-2",
    flexible="2+",
    fields=[
        Field("ErrorCode", "int16", "0+"),
        Field("ErrorMessage", "string", "0+", nullable="0+"),
        Field("AuthBytes", "bytes", "0+"),
        Field("SessionLifetimeMs", "int64", "1+", default="0", ignorable=True),
    ],
)

DESCRIBE_USER_SCRAM_CREDENTIALS_REQUEST = Message(
    "DescribeUserScramCredentialsRequest",
    50,
    valid="0",
    flexible="0+",
    fields=[Field("Users", "[]UserName", "0+", nullable="0+", fields=[Field("Name", "string", "0+")])],
)

DESCRIBE_USER_SCRAM_CREDENTIALS_RESPONSE = Message(
    "DescribeUserScramCredentialsResponse",
    50,
    valid="0",
    flexible="0+",
    fields=[
        Field("ThrottleTimeMs", "int32", "0+"),
        Field("ErrorCode", "int16", "0+"),
        Field("ErrorMessage", "string", "0+", nullable="0+"),
        Field(
            "Results",
            "[]DescribeUserScramCredentialsResult",
            "0+",
            fields=[
                Field("User", "string", "0+"),
                Field("ErrorCode", "int16", "0+"),
                Field("ErrorMessage", "string", "0+", nullable="0+"),
                Field(
                    "CredentialInfos",
                    "[]CredentialInfo",
                    "0+",
                    fields=[Field("Mechanism", "int8", "0+"), Field("Iterations", "int32", "0+")],
                ),
            ],
        ),
    ],
)

ALTER_USER_SCRAM_CREDENTIALS_REQUEST = Message(
    "AlterUserScramCredentialsRequest",
    51,
    valid="0",
    flexible="0+",
    fields=[
        Field(
            "Deletions",
            "[]ScramCredentialDeletion",
            "0+",
            fields=[Field("Name", "string", "0+"), Field("Mechanism", "int8", "0+")],
        ),
        Field(
            "Upsertions",
            "[]ScramCredentialUpsertion",
            "0+",
            fields=[
                Field("Name", "string", "0+"),
                Field("Mechanism", "int8", "0+"),
                Field("Iterations", "int32", "0+"),
                Field("Salt", "bytes", "0+"),
                Field("SaltedPassword", "bytes", "0+"),
            ],
        ),
    ],
)

ALTER_USER_SCRAM_CREDENTIALS_RESPONSE = Message(
    "AlterUserScramCredentialsResponse",
    51,
    valid="0",
    flexible="0+",
    fields=[
        Field("ThrottleTimeMs", "int32", "0+"),
        Field(
            "Results",
            "[]AlterUserScramCredentialsResult",
            "0+",
            fields=[
                Field("User", "string", "0+"),
                Field("ErrorCode", "int16", "0+"),
                Field("ErrorMessage", "string", "0+", nullable="0+"),
            ],
        ),
    ],
)


# -- transactions (KIP-98) ----------------------------------------------------------------------

_ADD_PARTITIONS_TO_TXN_TOPIC = [
    Field("Name", "string", "0+"),
    Field("Partitions", "[]int32", "0+"),
]

# Versions 0-3 come from producers; 4+ from brokers (KIP-890): a partition's leader asking the
# transaction coordinator, with VerifyOnly, whether a transaction has added its partition before
# it appends a transactional batch. Version 5 only adds TRANSACTION_ABORTABLE to the answers.
ADD_PARTITIONS_TO_TXN_REQUEST = Message(
    "AddPartitionsToTxnRequest",
    24,
    valid="0-5",
    flexible="3+",
    fields=[
        Field(
            "Transactions",
            "[]AddPartitionsToTxnTransaction",
            "4+",
            fields=[
                Field("TransactionalId", "string", "4+"),
                Field("ProducerId", "int64", "4+"),
                Field("ProducerEpoch", "int16", "4+"),
                Field("VerifyOnly", "bool", "4+", default="false"),
                Field("Topics", "[]AddPartitionsToTxnTopic", "4+", fields=_ADD_PARTITIONS_TO_TXN_TOPIC),
            ],
        ),
        Field("V3AndBelowTransactionalId", "string", "0-3"),
        Field("V3AndBelowProducerId", "int64", "0-3"),
        Field("V3AndBelowProducerEpoch", "int16", "0-3"),
        Field("V3AndBelowTopics", "[]AddPartitionsToTxnTopic", "0-3", fields=_ADD_PARTITIONS_TO_TXN_TOPIC),
    ],
)

_ADD_PARTITIONS_TO_TXN_TOPIC_RESULT = [
    Field("Name", "string", "0+"),
    Field(
        "ResultsByPartition",
        "[]AddPartitionsToTxnPartitionResult",
        "0+",
        fields=[
            Field("PartitionIndex", "int32", "0+"),
            Field("PartitionErrorCode", "int16", "0+"),
        ],
    ),
]

ADD_PARTITIONS_TO_TXN_RESPONSE = Message(
    "AddPartitionsToTxnResponse",
    24,
    valid="0-5",
    flexible="3+",
    fields=[
        Field("ThrottleTimeMs", "int32", "0+"),
        Field("ErrorCode", "int16", "4+", ignorable=True),
        Field(
            "ResultsByTransaction",
            "[]AddPartitionsToTxnResult",
            "4+",
            fields=[
                Field("TransactionalId", "string", "4+"),
                Field(
                    "TopicResults",
                    "[]AddPartitionsToTxnTopicResult",
                    "4+",
                    fields=_ADD_PARTITIONS_TO_TXN_TOPIC_RESULT,
                ),
            ],
        ),
        Field(
            "ResultsByTopicV3AndBelow",
            "[]AddPartitionsToTxnTopicResult",
            "0-3",
            fields=_ADD_PARTITIONS_TO_TXN_TOPIC_RESULT,
        ),
    ],
)

ADD_OFFSETS_TO_TXN_REQUEST = Message(
    "AddOffsetsToTxnRequest",
    25,
    valid="0-3",
    flexible="3+",
    fields=[
        Field("TransactionalId", "string", "0+"),
        Field("ProducerId", "int64", "0+"),
        Field("ProducerEpoch", "int16", "0+"),
        Field("GroupId", "string", "0+"),
    ],
)

ADD_OFFSETS_TO_TXN_RESPONSE = Message(
    "AddOffsetsToTxnResponse",
    25,
    valid="0-3",
    flexible="3+",
    fields=[
        Field("ThrottleTimeMs", "int32", "0+"),
        Field("ErrorCode", "int16", "0+"),
    ],
)

END_TXN_REQUEST = Message(
    "EndTxnRequest",
    26,
    valid="0-3",
    flexible="3+",
    fields=[
        Field("TransactionalId", "string", "0+"),
        Field("ProducerId", "int64", "0+"),
        Field("ProducerEpoch", "int16", "0+"),
        Field("Committed", "bool", "0+"),
    ],
)

END_TXN_RESPONSE = Message(
    "EndTxnResponse",
    26,
    valid="0-3",
    flexible="3+",
    fields=[
        Field("ThrottleTimeMs", "int32", "0+"),
        Field("ErrorCode", "int16", "0+"),
    ],
)

WRITE_TXN_MARKERS_REQUEST = Message(
    "WriteTxnMarkersRequest",
    27,
    valid="0-1",
    flexible="1+",
    fields=[
        Field(
            "Markers",
            "[]WritableTxnMarker",
            "0+",
            fields=[
                Field("ProducerId", "int64", "0+"),
                Field("ProducerEpoch", "int16", "0+"),
                Field("TransactionResult", "bool", "0+"),
                Field(
                    "Topics",
                    "[]WritableTxnMarkerTopic",
                    "0+",
                    fields=[
                        Field("Name", "string", "0+"),
                        Field("PartitionIndexes", "[]int32", "0+"),
                    ],
                ),
                Field("CoordinatorEpoch", "int32", "0+"),
            ],
        ),
    ],
)

WRITE_TXN_MARKERS_RESPONSE = Message(
    "WriteTxnMarkersResponse",
    27,
    valid="0-1",
    flexible="1+",
    fields=[
        Field(
            "Markers",
            "[]WritableTxnMarkerResult",
            "0+",
            fields=[
                Field("ProducerId", "int64", "0+"),
                Field(
                    "Topics",
                    "[]WritableTxnMarkerTopicResult",
                    "0+",
                    fields=[
                        Field("Name", "string", "0+"),
                        Field(
                            "Partitions",
                            "[]WritableTxnMarkerPartitionResult",
                            "0+",
                            fields=[
                                Field("PartitionIndex", "int32", "0+"),
                                Field("ErrorCode", "int16", "0+"),
                            ],
                        ),
                    ],
                ),
            ],
        ),
    ],
)

TXN_OFFSET_COMMIT_REQUEST = Message(
    "TxnOffsetCommitRequest",
    28,
    valid="0-3",
    flexible="3+",
    fields=[
        Field("TransactionalId", "string", "0+"),
        Field("GroupId", "string", "0+"),
        Field("ProducerId", "int64", "0+"),
        Field("ProducerEpoch", "int16", "0+"),
        Field("GenerationId", "int32", "3+", default="-1"),
        Field("MemberId", "string", "3+", default=""),
        Field("GroupInstanceId", "string", "3+", nullable="3+", default="null"),
        Field(
            "Topics",
            "[]TxnOffsetCommitRequestTopic",
            "0+",
            fields=[
                Field("Name", "string", "0+"),
                Field(
                    "Partitions",
                    "[]TxnOffsetCommitRequestPartition",
                    "0+",
                    fields=[
                        Field("PartitionIndex", "int32", "0+"),
                        Field("CommittedOffset", "int64", "0+"),
                        Field("CommittedLeaderEpoch", "int32", "2+", default="-1", ignorable=True),
                        Field("CommittedMetadata", "string", "0+", nullable="0+"),
                    ],
                ),
            ],
        ),
    ],
)

TXN_OFFSET_COMMIT_RESPONSE = Message(
    "TxnOffsetCommitResponse",
    28,
    valid="0-3",
    flexible="3+",
    fields=[
        Field("ThrottleTimeMs", "int32", "0+"),
        Field(
            "Topics",
            "[]TxnOffsetCommitResponseTopic",
            "0+",
            fields=[
                Field("Name", "string", "0+"),
                Field(
                    "Partitions",
                    "[]TxnOffsetCommitResponsePartition",
                    "0+",
                    fields=[
                        Field("PartitionIndex", "int32", "0+"),
                        Field("ErrorCode", "int16", "0+"),
                    ],
                ),
            ],
        ),
    ],
)

REQUESTS: dict[int, Message] = {
    m.api_key: m
    for m in (
        PRODUCE_REQUEST,
        FETCH_REQUEST,
        LIST_OFFSETS_REQUEST,
        METADATA_REQUEST,
        OFFSET_COMMIT_REQUEST,
        OFFSET_FETCH_REQUEST,
        FIND_COORDINATOR_REQUEST,
        JOIN_GROUP_REQUEST,
        HEARTBEAT_REQUEST,
        LEAVE_GROUP_REQUEST,
        SYNC_GROUP_REQUEST,
        DESCRIBE_GROUPS_REQUEST,
        LIST_GROUPS_REQUEST,
        API_VERSIONS_REQUEST,
        CREATE_TOPICS_REQUEST,
        DELETE_TOPICS_REQUEST,
        INIT_PRODUCER_ID_REQUEST,
        OFFSET_FOR_LEADER_EPOCH_REQUEST,
        DESCRIBE_ACLS_REQUEST,
        CREATE_ACLS_REQUEST,
        DELETE_ACLS_REQUEST,
        DESCRIBE_CONFIGS_REQUEST,
        DELETE_GROUPS_REQUEST,
        SASL_HANDSHAKE_REQUEST,
        SASL_AUTHENTICATE_REQUEST,
        DESCRIBE_USER_SCRAM_CREDENTIALS_REQUEST,
        ALTER_USER_SCRAM_CREDENTIALS_REQUEST,
        ADD_PARTITIONS_TO_TXN_REQUEST,
        ADD_OFFSETS_TO_TXN_REQUEST,
        END_TXN_REQUEST,
        WRITE_TXN_MARKERS_REQUEST,
        TXN_OFFSET_COMMIT_REQUEST,
    )
}
"""Request body schemas by API key."""

RESPONSES: dict[int, Message] = {
    m.api_key: m
    for m in (
        PRODUCE_RESPONSE,
        FETCH_RESPONSE,
        LIST_OFFSETS_RESPONSE,
        METADATA_RESPONSE,
        OFFSET_COMMIT_RESPONSE,
        OFFSET_FETCH_RESPONSE,
        FIND_COORDINATOR_RESPONSE,
        JOIN_GROUP_RESPONSE,
        HEARTBEAT_RESPONSE,
        LEAVE_GROUP_RESPONSE,
        SYNC_GROUP_RESPONSE,
        DESCRIBE_GROUPS_RESPONSE,
        LIST_GROUPS_RESPONSE,
        API_VERSIONS_RESPONSE,
        CREATE_TOPICS_RESPONSE,
        DELETE_TOPICS_RESPONSE,
        INIT_PRODUCER_ID_RESPONSE,
        OFFSET_FOR_LEADER_EPOCH_RESPONSE,
        DESCRIBE_ACLS_RESPONSE,
        CREATE_ACLS_RESPONSE,
        DELETE_ACLS_RESPONSE,
        DESCRIBE_CONFIGS_RESPONSE,
        DELETE_GROUPS_RESPONSE,
        SASL_HANDSHAKE_RESPONSE,
        SASL_AUTHENTICATE_RESPONSE,
        DESCRIBE_USER_SCRAM_CREDENTIALS_RESPONSE,
        ALTER_USER_SCRAM_CREDENTIALS_RESPONSE,
        ADD_PARTITIONS_TO_TXN_RESPONSE,
        ADD_OFFSETS_TO_TXN_RESPONSE,
        END_TXN_RESPONSE,
        WRITE_TXN_MARKERS_RESPONSE,
        TXN_OFFSET_COMMIT_RESPONSE,
    )
}
"""Response body schemas by API key."""


# ----------------------------------------------------------------------------------------------
# Administration (issue 19): partitions, configs, records, leaders, reassignments, log dirs,
# group offsets and producers, as the admin clients of Kafka tools call them.

CREATE_PARTITIONS_REQUEST = Message(
    "CreatePartitionsRequest",
    37,
    valid="0-3",
    flexible="2+",
    fields=[
        Field(
            "Topics",
            "[]CreatePartitionsTopic",
            "0+",
            fields=[
                Field("Name", "string", "0+"),
                Field("Count", "int32", "0+"),
                Field(
                    "Assignments",
                    "[]CreatePartitionsAssignment",
                    "0+",
                    nullable="0+",
                    fields=[Field("BrokerIds", "[]int32", "0+")],
                ),
            ],
        ),
        Field("TimeoutMs", "int32", "0+"),
        Field("ValidateOnly", "bool", "0+"),
    ],
)

CREATE_PARTITIONS_RESPONSE = Message(
    "CreatePartitionsResponse",
    37,
    valid="0-3",
    flexible="2+",
    fields=[
        Field("ThrottleTimeMs", "int32", "0+"),
        Field(
            "Results",
            "[]CreatePartitionsTopicResult",
            "0+",
            fields=[
                Field("Name", "string", "0+"),
                Field("ErrorCode", "int16", "0+"),
                Field("ErrorMessage", "string", "0+", nullable="0+", default="null"),
            ],
        ),
    ],
)

ALTER_CONFIGS_REQUEST = Message(
    "AlterConfigsRequest",
    33,
    valid="0-2",
    flexible="2+",
    fields=[
        Field(
            "Resources",
            "[]AlterConfigsResource",
            "0+",
            fields=[
                Field("ResourceType", "int8", "0+"),
                Field("ResourceName", "string", "0+"),
                Field(
                    "Configs",
                    "[]AlterableConfig",
                    "0+",
                    fields=[Field("Name", "string", "0+"), Field("Value", "string", "0+", nullable="0+")],
                ),
            ],
        ),
        Field("ValidateOnly", "bool", "0+"),
    ],
)

_ALTER_CONFIGS_RESOURCE_RESPONSE = [
    Field("ErrorCode", "int16", "0+"),
    Field("ErrorMessage", "string", "0+", nullable="0+"),
    Field("ResourceType", "int8", "0+"),
    Field("ResourceName", "string", "0+"),
]

ALTER_CONFIGS_RESPONSE = Message(
    "AlterConfigsResponse",
    33,
    valid="0-2",
    flexible="2+",
    fields=[
        Field("ThrottleTimeMs", "int32", "0+"),
        Field("Responses", "[]AlterConfigsResourceResponse", "0+", fields=_ALTER_CONFIGS_RESOURCE_RESPONSE),
    ],
)

INCREMENTAL_ALTER_CONFIGS_REQUEST = Message(
    "IncrementalAlterConfigsRequest",
    44,
    valid="0-1",
    flexible="1+",
    fields=[
        Field(
            "Resources",
            "[]AlterConfigsResource",
            "0+",
            fields=[
                Field("ResourceType", "int8", "0+"),
                Field("ResourceName", "string", "0+"),
                Field(
                    "Configs",
                    "[]AlterableConfig",
                    "0+",
                    fields=[
                        Field("Name", "string", "0+"),
                        Field("ConfigOperation", "int8", "0+"),
                        Field("Value", "string", "0+", nullable="0+"),
                    ],
                ),
            ],
        ),
        Field("ValidateOnly", "bool", "0+"),
    ],
)

INCREMENTAL_ALTER_CONFIGS_RESPONSE = Message(
    "IncrementalAlterConfigsResponse",
    44,
    valid="0-1",
    flexible="1+",
    fields=[
        Field("ThrottleTimeMs", "int32", "0+"),
        Field("Responses", "[]AlterConfigsResourceResponse", "0+", fields=_ALTER_CONFIGS_RESOURCE_RESPONSE),
    ],
)

DELETE_RECORDS_REQUEST = Message(
    "DeleteRecordsRequest",
    21,
    valid="0-2",
    flexible="2+",
    fields=[
        Field(
            "Topics",
            "[]DeleteRecordsTopic",
            "0+",
            fields=[
                Field("Name", "string", "0+"),
                Field(
                    "Partitions",
                    "[]DeleteRecordsPartition",
                    "0+",
                    fields=[Field("PartitionIndex", "int32", "0+"), Field("Offset", "int64", "0+")],
                ),
            ],
        ),
        Field("TimeoutMs", "int32", "0+"),
    ],
)

DELETE_RECORDS_RESPONSE = Message(
    "DeleteRecordsResponse",
    21,
    valid="0-2",
    flexible="2+",
    fields=[
        Field("ThrottleTimeMs", "int32", "0+"),
        Field(
            "Topics",
            "[]DeleteRecordsTopicResult",
            "0+",
            fields=[
                Field("Name", "string", "0+"),
                Field(
                    "Partitions",
                    "[]DeleteRecordsPartitionResult",
                    "0+",
                    fields=[
                        Field("PartitionIndex", "int32", "0+"),
                        Field("LowWatermark", "int64", "0+"),
                        Field("ErrorCode", "int16", "0+"),
                    ],
                ),
            ],
        ),
    ],
)

ELECT_LEADERS_REQUEST = Message(
    "ElectLeadersRequest",
    43,
    valid="0-2",
    flexible="2+",
    fields=[
        Field("ElectionType", "int8", "1+"),
        Field(
            "TopicPartitions",
            "[]TopicPartitions",
            "0+",
            nullable="0+",
            fields=[Field("Topic", "string", "0+"), Field("Partitions", "[]int32", "0+")],
        ),
        Field("TimeoutMs", "int32", "0+", default="60000"),
    ],
)

ELECT_LEADERS_RESPONSE = Message(
    "ElectLeadersResponse",
    43,
    valid="0-2",
    flexible="2+",
    fields=[
        Field("ThrottleTimeMs", "int32", "0+"),
        Field("ErrorCode", "int16", "1+"),
        Field(
            "ReplicaElectionResults",
            "[]ReplicaElectionResult",
            "0+",
            fields=[
                Field("Topic", "string", "0+"),
                Field(
                    "PartitionResult",
                    "[]PartitionResult",
                    "0+",
                    fields=[
                        Field("PartitionId", "int32", "0+"),
                        Field("ErrorCode", "int16", "0+"),
                        Field("ErrorMessage", "string", "0+", nullable="0+"),
                    ],
                ),
            ],
        ),
    ],
)

DESCRIBE_CLUSTER_REQUEST = Message(
    "DescribeClusterRequest",
    60,
    valid="0-2",
    flexible="0+",
    fields=[
        Field("IncludeClusterAuthorizedOperations", "bool", "0+"),
        Field("EndpointType", "int8", "1+", default="1"),
        Field("IncludeFencedBrokers", "bool", "2+"),
    ],
)

DESCRIBE_CLUSTER_RESPONSE = Message(
    "DescribeClusterResponse",
    60,
    valid="0-2",
    flexible="0+",
    fields=[
        Field("ThrottleTimeMs", "int32", "0+"),
        Field("ErrorCode", "int16", "0+"),
        Field("ErrorMessage", "string", "0+", nullable="0+", default="null"),
        Field("EndpointType", "int8", "1+", default="1"),
        Field("ClusterId", "string", "0+"),
        Field("ControllerId", "int32", "0+", default="-1"),
        Field(
            "Brokers",
            "[]DescribeClusterBroker",
            "0+",
            fields=[
                Field("BrokerId", "int32", "0+"),
                Field("Host", "string", "0+"),
                Field("Port", "int32", "0+"),
                Field("Rack", "string", "0+", nullable="0+", default="null"),
                Field("IsFenced", "bool", "2+"),
            ],
        ),
        Field("ClusterAuthorizedOperations", "int32", "0+", default="-2147483648"),
    ],
)

ALTER_PARTITION_REASSIGNMENTS_REQUEST = Message(
    "AlterPartitionReassignmentsRequest",
    45,
    valid="0-1",
    flexible="0+",
    fields=[
        Field("TimeoutMs", "int32", "0+", default="60000"),
        Field("AllowReplicationFactorChange", "bool", "1+", default="true"),
        Field(
            "Topics",
            "[]ReassignableTopic",
            "0+",
            fields=[
                Field("Name", "string", "0+"),
                Field(
                    "Partitions",
                    "[]ReassignablePartition",
                    "0+",
                    fields=[
                        Field("PartitionIndex", "int32", "0+"),
                        Field("Replicas", "[]int32", "0+", nullable="0+", default="null"),
                    ],
                ),
            ],
        ),
    ],
)

ALTER_PARTITION_REASSIGNMENTS_RESPONSE = Message(
    "AlterPartitionReassignmentsResponse",
    45,
    valid="0-1",
    flexible="0+",
    fields=[
        Field("ThrottleTimeMs", "int32", "0+"),
        Field("AllowReplicationFactorChange", "bool", "1+", default="true", ignorable=True),
        Field("ErrorCode", "int16", "0+"),
        Field("ErrorMessage", "string", "0+", nullable="0+"),
        Field(
            "Responses",
            "[]ReassignableTopicResponse",
            "0+",
            fields=[
                Field("Name", "string", "0+"),
                Field(
                    "Partitions",
                    "[]ReassignablePartitionResponse",
                    "0+",
                    fields=[
                        Field("PartitionIndex", "int32", "0+"),
                        Field("ErrorCode", "int16", "0+"),
                        Field("ErrorMessage", "string", "0+", nullable="0+"),
                    ],
                ),
            ],
        ),
    ],
)

LIST_PARTITION_REASSIGNMENTS_REQUEST = Message(
    "ListPartitionReassignmentsRequest",
    46,
    valid="0",
    flexible="0+",
    fields=[
        Field("TimeoutMs", "int32", "0+", default="60000"),
        Field(
            "Topics",
            "[]ListPartitionReassignmentsTopics",
            "0+",
            nullable="0+",
            default="null",
            fields=[Field("Name", "string", "0+"), Field("PartitionIndexes", "[]int32", "0+")],
        ),
    ],
)

LIST_PARTITION_REASSIGNMENTS_RESPONSE = Message(
    "ListPartitionReassignmentsResponse",
    46,
    valid="0",
    flexible="0+",
    fields=[
        Field("ThrottleTimeMs", "int32", "0+"),
        Field("ErrorCode", "int16", "0+"),
        Field("ErrorMessage", "string", "0+", nullable="0+"),
        Field(
            "Topics",
            "[]OngoingTopicReassignment",
            "0+",
            fields=[
                Field("Name", "string", "0+"),
                Field(
                    "Partitions",
                    "[]OngoingPartitionReassignment",
                    "0+",
                    fields=[
                        Field("PartitionIndex", "int32", "0+"),
                        Field("Replicas", "[]int32", "0+"),
                        Field("AddingReplicas", "[]int32", "0+"),
                        Field("RemovingReplicas", "[]int32", "0+"),
                    ],
                ),
            ],
        ),
    ],
)

DESCRIBE_LOG_DIRS_REQUEST = Message(
    "DescribeLogDirsRequest",
    35,
    valid="1-4",
    flexible="2+",
    fields=[
        Field(
            "Topics",
            "[]DescribableLogDirTopic",
            "0+",
            nullable="0+",
            fields=[Field("Topic", "string", "0+"), Field("Partitions", "[]int32", "0+")],
        ),
    ],
)

DESCRIBE_LOG_DIRS_RESPONSE = Message(
    "DescribeLogDirsResponse",
    35,
    valid="1-4",
    flexible="2+",
    fields=[
        Field("ThrottleTimeMs", "int32", "0+"),
        Field("ErrorCode", "int16", "3+", ignorable=True),
        Field(
            "Results",
            "[]DescribeLogDirsResult",
            "0+",
            fields=[
                Field("ErrorCode", "int16", "0+"),
                Field("LogDir", "string", "0+"),
                Field(
                    "Topics",
                    "[]DescribeLogDirsTopic",
                    "0+",
                    fields=[
                        Field("Name", "string", "0+"),
                        Field(
                            "Partitions",
                            "[]DescribeLogDirsPartition",
                            "0+",
                            fields=[
                                Field("PartitionIndex", "int32", "0+"),
                                Field("PartitionSize", "int64", "0+"),
                                Field("OffsetLag", "int64", "0+"),
                                Field("IsFutureKey", "bool", "0+"),
                            ],
                        ),
                    ],
                ),
                Field("TotalBytes", "int64", "4+", ignorable=True, default="-1"),
                Field("UsableBytes", "int64", "4+", ignorable=True, default="-1"),
            ],
        ),
    ],
)

OFFSET_DELETE_REQUEST = Message(
    "OffsetDeleteRequest",
    47,
    valid="0",
    flexible="none",
    fields=[
        Field("GroupId", "string", "0+"),
        Field(
            "Topics",
            "[]OffsetDeleteRequestTopic",
            "0+",
            fields=[
                Field("Name", "string", "0+"),
                Field(
                    "Partitions",
                    "[]OffsetDeleteRequestPartition",
                    "0+",
                    fields=[Field("PartitionIndex", "int32", "0+")],
                ),
            ],
        ),
    ],
)

OFFSET_DELETE_RESPONSE = Message(
    "OffsetDeleteResponse",
    47,
    valid="0",
    flexible="none",
    fields=[
        Field("ErrorCode", "int16", "0+"),
        Field("ThrottleTimeMs", "int32", "0+", ignorable=True),
        Field(
            "Topics",
            "[]OffsetDeleteResponseTopic",
            "0+",
            fields=[
                Field("Name", "string", "0+"),
                Field(
                    "Partitions",
                    "[]OffsetDeleteResponsePartition",
                    "0+",
                    fields=[Field("PartitionIndex", "int32", "0+"), Field("ErrorCode", "int16", "0+")],
                ),
            ],
        ),
    ],
)

DESCRIBE_PRODUCERS_REQUEST = Message(
    "DescribeProducersRequest",
    61,
    valid="0",
    flexible="0+",
    fields=[
        Field(
            "Topics",
            "[]TopicRequest",
            "0+",
            fields=[Field("Name", "string", "0+"), Field("PartitionIndexes", "[]int32", "0+")],
        ),
    ],
)

DESCRIBE_PRODUCERS_RESPONSE = Message(
    "DescribeProducersResponse",
    61,
    valid="0",
    flexible="0+",
    fields=[
        Field("ThrottleTimeMs", "int32", "0+"),
        Field(
            "Topics",
            "[]TopicResponse",
            "0+",
            fields=[
                Field("Name", "string", "0+"),
                Field(
                    "Partitions",
                    "[]PartitionResponse",
                    "0+",
                    fields=[
                        Field("PartitionIndex", "int32", "0+"),
                        Field("ErrorCode", "int16", "0+"),
                        Field("ErrorMessage", "string", "0+", nullable="0+", default="null"),
                        Field(
                            "ActiveProducers",
                            "[]ProducerState",
                            "0+",
                            fields=[
                                Field("ProducerId", "int64", "0+"),
                                Field("ProducerEpoch", "int32", "0+"),
                                Field("LastSequence", "int32", "0+", default="-1"),
                                Field("LastTimestamp", "int64", "0+", default="-1"),
                                Field("CoordinatorEpoch", "int32", "0+"),
                                Field("CurrentTxnStartOffset", "int64", "0+", default="-1"),
                            ],
                        ),
                    ],
                ),
            ],
        ),
    ],
)

_ADMIN_MESSAGES = (
    (CREATE_PARTITIONS_REQUEST, CREATE_PARTITIONS_RESPONSE),
    (ALTER_CONFIGS_REQUEST, ALTER_CONFIGS_RESPONSE),
    (INCREMENTAL_ALTER_CONFIGS_REQUEST, INCREMENTAL_ALTER_CONFIGS_RESPONSE),
    (DELETE_RECORDS_REQUEST, DELETE_RECORDS_RESPONSE),
    (ELECT_LEADERS_REQUEST, ELECT_LEADERS_RESPONSE),
    (DESCRIBE_CLUSTER_REQUEST, DESCRIBE_CLUSTER_RESPONSE),
    (ALTER_PARTITION_REASSIGNMENTS_REQUEST, ALTER_PARTITION_REASSIGNMENTS_RESPONSE),
    (LIST_PARTITION_REASSIGNMENTS_REQUEST, LIST_PARTITION_REASSIGNMENTS_RESPONSE),
    (DESCRIBE_LOG_DIRS_REQUEST, DESCRIBE_LOG_DIRS_RESPONSE),
    (OFFSET_DELETE_REQUEST, OFFSET_DELETE_RESPONSE),
    (DESCRIBE_PRODUCERS_REQUEST, DESCRIBE_PRODUCERS_RESPONSE),
)
REQUESTS.update({request.api_key: request for request, _ in _ADMIN_MESSAGES})
RESPONSES.update({response.api_key: response for _, response in _ADMIN_MESSAGES})
