"""Which ACL each table API call needs, checked with the broker's authorizer (Kafka's model:
the table is the topic resource of the same name).

  scan (DoGet), lookup, prefix-lookup, full-read, kv-snapshots, kv-remote-snapshot,
  remote-segments                                    READ on the table
  append / upsert / delete (DoPut)                   WRITE on the table
  create-table                                       CREATE on the cluster or on the table (as CreateTopics)
  drop-table                                         DELETE on the table
  describe, offsets, status, lake-info, GetFlightInfo,
  GetSchema                                          DESCRIBE on the table
  list-tables, ListFlights, lake-status              DESCRIBE, the list filtered to what may be described
  kv-snapshot (take one now), compact                ALTER on the table: they change how the table is
                                                     stored, not its rows
  lake-acquire/-heartbeat/-complete/-fail            CLUSTER_ACTION on the cluster: the tiering job is
                                                     the cluster's own service, like a follower broker

A table's changelog view (`<table>.changelog`) follows its table's ACLs. Kafka's implications
apply (the authorizer's): READ, WRITE, DELETE or ALTER imply DESCRIBE.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import pyarrow.flight as flight

from fluvial.broker.flight import compaction as compaction_api
from fluvial.broker.flight import pk as pk_api
from fluvial.broker.flight import tiering as tiering_api
from fluvial.broker.flight.auth import BROKER_PRINCIPAL_TYPE, peer_host, principal_of
from fluvial.broker.table_kind import CHANGELOG_SUFFIX
from fluvial.client.wire import CREATE_TABLE, DESCRIBE, DROP_TABLE, LIST_TABLES, OFFSETS
from fluvial.security.acls import AclOperation, ResourceType
from fluvial.security.principal import Principal
from fluvial.tiering.lake import actions as lake_actions

CLUSTER_NAME = "kafka-cluster"  # Kafka's one cluster resource
# Refusals are logged here at INFO (like Kafka's kafka.authorizer.logger), one line each.
log = logging.getLogger(__name__)

Op = AclOperation
TABLE_ACTIONS: dict[str, AclOperation] = {
    DESCRIBE: Op.DESCRIBE, OFFSETS: Op.DESCRIBE, tiering_api.STATUS: Op.DESCRIBE, lake_actions.LAKE_INFO: Op.DESCRIBE,
    DROP_TABLE: Op.DELETE,
    pk_api.LOOKUP: Op.READ, pk_api.PREFIX_LOOKUP: Op.READ, pk_api.FULL_READ: Op.READ, pk_api.KV_SNAPSHOTS: Op.READ,
    pk_api.REMOTE_SNAPSHOT: Op.READ, tiering_api.REMOTE_SEGMENTS: Op.READ,
    pk_api.KV_SNAPSHOT: Op.ALTER, compaction_api.COMPACT: Op.ALTER,
}
CLUSTER_ACTIONS = {lake_actions.LAKE_ACQUIRE, lake_actions.LAKE_HEARTBEAT, lake_actions.LAKE_COMPLETE,
                   lake_actions.LAKE_FAIL}
LISTING_ACTIONS = {LIST_TABLES, lake_actions.LAKE_STATUS}


@dataclass(frozen=True)
class Caller:
    """Who makes a table API call, and what the broker lets them do."""

    broker: object
    principal: Principal
    host: str

    @classmethod
    def of(cls, broker, context) -> "Caller":
        return cls(broker, principal_of(context), peer_host(context))

    def _allowed(self, operation: AclOperation, resource_type: ResourceType, name: str) -> bool:
        if self.principal.type == BROKER_PRINCIPAL_TYPE:
            return True  # the broker's own services (a token only this broker can sign)
        authorizer = getattr(self.broker, "authorizer", None)
        if authorizer is None:
            return True
        return authorizer.authorize(self.principal, self.host, operation, resource_type, name)

    def may(self, operation: AclOperation, table: str) -> bool:
        return self._allowed(operation, ResourceType.TOPIC, acl_table_name(self.broker, table))

    def _refused(self, message: str) -> flight.FlightUnauthorizedError:
        log.info("table API request refused: %s (from %s)", message, self.host)
        return flight.FlightUnauthorizedError(message)

    def require(self, operation: AclOperation, table: str) -> None:
        """Raises FlightUnauthorizedError (PERMISSION_DENIED) unless the table's ACLs allow."""
        if not self.may(operation, table):
            raise self._refused(
                f"{self.principal} is not authorized to {operation.name} table {table!r}: "
                f"an ACL allowing {operation.name} on topic {acl_table_name(self.broker, table)!r} is needed")

    def require_create(self, table: str) -> None:
        if self._allowed(Op.CREATE, ResourceType.CLUSTER, CLUSTER_NAME) or self.may(Op.CREATE, table):
            return
        raise self._refused(
            f"{self.principal} is not authorized to CREATE table {table!r}: an ACL allowing CREATE on the "
            f"cluster or on topic {table!r} is needed")

    def require_cluster(self, operation: AclOperation, what: str) -> None:
        if not self._allowed(operation, ResourceType.CLUSTER, CLUSTER_NAME):
            raise self._refused(
                f"{self.principal} is not authorized to {what}: an ACL allowing {operation.name} on the cluster "
                f"is needed")


def acl_table_name(broker, name: str) -> str:
    """The table whose ACLs a name follows: a changelog view follows its table."""
    if name.endswith(CHANGELOG_SUFFIX):
        base = name[: -len(CHANGELOG_SUFFIX)]
        if base in broker.tables.tables:
            return base
    return name


def table_of(body: dict) -> str | None:
    name = body.get("table", body.get("name"))
    return name if isinstance(name, str) and name else None


def check_action(caller: Caller, kind: str, body: dict) -> None:
    """Refuses an action the caller may not run, before it changes or reads anything."""
    if kind in LISTING_ACTIONS:
        name = table_of(body) if kind == lake_actions.LAKE_STATUS else None
        if name is not None:
            caller.require(Op.DESCRIBE, name)
        return  # the result is filtered instead
    if kind in CLUSTER_ACTIONS:
        caller.require_cluster(Op.CLUSTER_ACTION, f"run the lake tiering action {kind!r}")
        return
    name = table_of(body)
    if name is None:
        return  # the action itself refuses a request without a table
    if kind == CREATE_TABLE:
        caller.require_create(name)
    elif kind in TABLE_ACTIONS:
        caller.require(TABLE_ACTIONS[kind], name)
    else:
        # An action this table does not know of (or a new one): ALTER is the safe default.
        caller.require(Op.ALTER, name)
