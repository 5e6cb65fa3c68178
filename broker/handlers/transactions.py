"""Transactions: AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn,
DescribeTransactions, ListTransactions; the coordinator's start, recovery and timeouts.

ACLs as Kafka checks them: WRITE on the transactional id for every transactional request,
WRITE on each topic added, READ on the group for AddOffsetsToTxn and TxnOffsetCommit
(and READ on each topic committed), CLUSTER_ACTION for the batched broker form of
AddPartitionsToTxn (v4+), DESCRIBE on the transactional id to describe or list it.
PRODUCER_FENCED is answered from the versions that know it (KIP-588), INVALID_PRODUCER_EPOCH
before them.
"""
from __future__ import annotations

import asyncio
import logging
import re

from fluvial.broker.authorization import allowed, allowed_on_cluster
from fluvial.broker.broker import on_start, on_stop
from fluvial.broker.handlers import RequestContext, handles
from fluvial.broker.transactions import STATES, TransactionCoordinator, TxnError
from fluvial.broker.txn_index import TransactionIndex
from fluvial.kv.txn_pk import PendingPkWrites
from fluvial.errors import FluvialError
from fluvial.protocol.errors import ErrorCode
from fluvial.protocol.messages import ApiKey, response_class
from fluvial.security.acls import AclOperation, ResourceType

log = logging.getLogger(__name__)

APT = response_class(ApiKey.ADD_PARTITIONS_TO_TXN)
TOC = response_class(ApiKey.TXN_OFFSET_COMMIT)
DT = response_class(ApiKey.DESCRIBE_TRANSACTIONS)
LT = response_class(ApiKey.LIST_TRANSACTIONS)
# How often open transactions are checked against their timeouts.
EXPIRY_INTERVAL_S = 1.0


@on_start
async def start_transactions(broker) -> None:
    index = TransactionIndex()
    broker.extensions["txn_index"] = index
    broker.extensions["txn_pk"] = PendingPkWrites(broker.io_executor, broker.cpu_executor)
    ids = broker.extensions["producer_ids"]
    coordinator = TransactionCoordinator(broker, broker.store, index,
                                         max_timeout_ms=broker.config.transaction_max_timeout_ms,
                                         id_expiration_ms=broker.config.transactional_id_expiration_ms)
    broker.extensions["transactions"] = coordinator
    broker.extensions["transactions_expiry"] = asyncio.get_running_loop().create_task(
        _recover_and_expire(broker, coordinator))


async def _recover_and_expire(broker, coordinator: TransactionCoordinator) -> None:
    ids = broker.extensions["producer_ids"]
    await asyncio.sleep(0)  # the other services (groups) start first
    try:
        await coordinator.recover()
    except Exception:
        log.exception("completing prepared transactions failed")
    while True:
        try:
            await coordinator.expire(ids.next_producer_id)
        except Exception:
            log.exception("transaction timeout check failed")
        await asyncio.sleep(EXPIRY_INTERVAL_S)


@on_stop
async def stop_transactions(broker) -> None:
    task = broker.extensions.pop("transactions_expiry", None)
    if task is not None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def coordinator(ctx: RequestContext) -> TransactionCoordinator:
    return ctx.broker.extensions["transactions"]


def fenced_code(ctx: RequestContext, first_version: int) -> ErrorCode:
    return ErrorCode.PRODUCER_FENCED if ctx.version >= first_version else ErrorCode.INVALID_PRODUCER_EPOCH


def _txn_id_ok(ctx: RequestContext, tid: str) -> bool:
    return allowed(ctx, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, tid)


# -- AddPartitionsToTxn ------------------------------------------------------------------------


async def _add_partitions(ctx: RequestContext, tid: str, pid: int, epoch: int, topics, verify_only: bool,
                          check_txn_acl: bool) -> dict[str, dict[int, int]]:
    """Per topic and partition, the error code of adding (or verifying) them."""
    wanted = [(t.name, p) for t in topics for p in t.partitions]
    results: dict[str, dict[int, int]] = {}

    def all_(code) -> dict[str, dict[int, int]]:
        out: dict[str, dict[int, int]] = {}
        for t, p in wanted:
            out.setdefault(t, {})[p] = int(code)
        return out

    if check_txn_acl and not _txn_id_ok(ctx, tid):
        return all_(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    errors: dict[tuple[str, int], int] = {}
    for t, p in wanted:
        if not allowed(ctx, AclOperation.WRITE, ResourceType.TOPIC, t):
            errors[(t, p)] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            continue
        try:
            table = ctx.broker.tables.get(t)
            if not 0 <= p < len(table.buckets):
                raise FluvialError("no such partition", code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        except FluvialError:
            errors[(t, p)] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    if errors:
        out = all_(ErrorCode.OPERATION_NOT_ATTEMPTED)
        for (t, p), code in errors.items():
            out[t][p] = int(code)
        return out
    c = coordinator(ctx)
    async with c.lock(tid):
        try:
            meta = c.current(tid, pid, epoch, fenced_code=fenced_code(ctx, 2))
            if verify_only:
                ok = meta.state == "Ongoing"
                for t, p in wanted:
                    results.setdefault(t, {})[p] = int(ErrorCode.NONE if ok and (t, p) in meta.partitions
                                                       else ErrorCode.INVALID_TXN_STATE)
                return results
            await c.add_partitions(meta, wanted)
        except TxnError as exc:
            return all_(exc.code)
    return all_(ErrorCode.NONE)


def _topic_results(by_topic: dict[str, dict[int, int]]):
    return [APT.AddPartitionsToTxnTopicResult(name=t, results_by_partition=[
        APT.AddPartitionsToTxnTopicResult.AddPartitionsToTxnPartitionResult(partition_index=p, partition_error_code=c)
        for p, c in parts.items()]) for t, parts in by_topic.items()]


@handles(ApiKey.ADD_PARTITIONS_TO_TXN, 0, 5)
async def add_partitions_to_txn(ctx: RequestContext, request):
    if ctx.version <= 3:
        by_topic = await _add_partitions(ctx, request.v3_and_below_transactional_id,
                                         request.v3_and_below_producer_id, request.v3_and_below_producer_epoch,
                                         request.v3_and_below_topics, False, True)
        return ctx.response(throttle_time_ms=0, results_by_topic_v3_and_below=_topic_results(by_topic))
    # The batched form is sent by brokers verifying produce requests: CLUSTER_ACTION.
    if not allowed_on_cluster(ctx, AclOperation.CLUSTER_ACTION):
        return ctx.response(throttle_time_ms=0, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                            results_by_transaction=[])
    results = []
    for txn in request.transactions:
        by_topic = await _add_partitions(ctx, txn.transactional_id, txn.producer_id, txn.producer_epoch,
                                         txn.topics, txn.verify_only, False)
        results.append(APT.AddPartitionsToTxnResult(transactional_id=txn.transactional_id,
                                                    topic_results=_topic_results(by_topic)))
    return ctx.response(throttle_time_ms=0, error_code=0, results_by_transaction=results)


# -- AddOffsetsToTxn ---------------------------------------------------------------------------


@handles(ApiKey.ADD_OFFSETS_TO_TXN, 0, 4)
async def add_offsets_to_txn(ctx: RequestContext, request):
    tid = request.transactional_id
    if not _txn_id_ok(ctx, tid):
        return ctx.response(throttle_time_ms=0, error_code=ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    if not allowed(ctx, AclOperation.READ, ResourceType.GROUP, request.group_id):
        return ctx.response(throttle_time_ms=0, error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED)
    c = coordinator(ctx)
    async with c.lock(tid):
        try:
            meta = c.current(tid, request.producer_id, request.producer_epoch, fenced_code=fenced_code(ctx, 2))
            await c.add_group(meta, request.group_id)
        except TxnError as exc:
            return ctx.response(throttle_time_ms=0, error_code=exc.code)
    return ctx.response(throttle_time_ms=0, error_code=ErrorCode.NONE)


# -- TxnOffsetCommit ---------------------------------------------------------------------------


@handles(ApiKey.TXN_OFFSET_COMMIT, 0, 5)
async def txn_offset_commit(ctx: RequestContext, request):
    tid, group_id = request.transactional_id, request.group_id
    wanted = [(t.name, p) for t in request.topics for p in t.partitions]

    def answer(codes: dict[tuple[str, int], int]):
        topics: dict[str, list] = {}
        for t, p in wanted:
            topics.setdefault(t, []).append(TOC.TxnOffsetCommitResponseTopic.TxnOffsetCommitResponsePartition(
                partition_index=p.partition_index, error_code=int(codes[(t, p.partition_index)])))
        return ctx.response(throttle_time_ms=0, topics=[
            TOC.TxnOffsetCommitResponseTopic(name=t, partitions=ps) for t, ps in topics.items()])

    def every(code) -> dict:
        return {(t, p.partition_index): code for t, p in wanted}

    if not _txn_id_ok(ctx, tid):
        return answer(every(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED))
    if not allowed(ctx, AclOperation.READ, ResourceType.GROUP, group_id):
        return answer(every(ErrorCode.GROUP_AUTHORIZATION_FAILED))
    codes = {}
    for t, p in wanted:
        if not allowed(ctx, AclOperation.READ, ResourceType.TOPIC, t):
            codes[(t, p.partition_index)] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
        elif ctx.broker.tables.tables.get(t) is None or not 0 <= p.partition_index < len(
                ctx.broker.tables.tables[t].buckets):
            codes[(t, p.partition_index)] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        elif p.committed_offset < 0:
            codes[(t, p.partition_index)] = ErrorCode.OFFSET_OUT_OF_RANGE
    if codes:
        return answer({**every(ErrorCode.OPERATION_NOT_ATTEMPTED), **codes})
    c = coordinator(ctx)
    groups = ctx.broker.extensions["groups"]
    async with c.lock(tid):
        try:
            meta = c.current(tid, request.producer_id, request.producer_epoch, fenced_code=fenced_code(ctx, 3))
            if ctx.version >= 5 and meta.state != "PrepareCommit" and meta.state != "PrepareAbort":
                await c.add_group(meta, group_id)   # transactions v2: no AddOffsetsToTxn first
            if meta.state != "Ongoing" or group_id not in meta.groups:
                raise TxnError(ErrorCode.INVALID_TXN_STATE, "AddOffsetsToTxn did not add this group")
            if ctx.version >= 3:
                code = groups.validate_txn_committer(group_id, request.generation_id, request.member_id,
                                                     request.group_instance_id)
                if code != ErrorCode.NONE:
                    raise TxnError(code)
            await c.hold_offsets(meta, group_id, [
                (t, p.partition_index, p.committed_offset,
                 p.committed_leader_epoch if ctx.version >= 2 else -1, p.committed_metadata or "")
                for t, p in wanted])
        except TxnError as exc:
            return answer(every(exc.code))
    return answer(every(ErrorCode.NONE))


# -- EndTxn --------------------------------------------------------------------------------------


@handles(ApiKey.END_TXN, 0, 5)
async def end_txn(ctx: RequestContext, request):
    tid = request.transactional_id
    v2 = ctx.version >= 5  # transactions v2 (KIP-890): the answer carries the bumped epoch

    def answer(code, meta=None):
        if not v2:
            return ctx.response(throttle_time_ms=0, error_code=code)
        return ctx.response(throttle_time_ms=0, error_code=code,
                            producer_id=meta.producer_id if meta is not None else -1,
                            producer_epoch=meta.producer_epoch if meta is not None else -1)

    if not _txn_id_ok(ctx, tid):
        return answer(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    c = coordinator(ctx)
    committed = bool(request.committed)
    async with c.lock(tid):
        if v2:
            done = c.completed_retry(tid, request.producer_id, request.producer_epoch, committed)
            if done is not None:
                return answer(ErrorCode.NONE, done)
        try:
            meta = c.current(tid, request.producer_id, request.producer_epoch, fenced_code=fenced_code(ctx, 2))
            await c.end_txn(meta, committed, bump=v2,
                            new_producer_id=ctx.broker.extensions["producer_ids"].next_producer_id)
        except TxnError as exc:
            return answer(exc.code)
        except FluvialError as exc:
            log.error("ending the transaction of %s failed: %s", tid, exc)
            return answer(ErrorCode.COORDINATOR_NOT_AVAILABLE)
    return answer(ErrorCode.NONE, meta)


# -- DescribeTransactions / ListTransactions ----------------------------------------------------


@handles(ApiKey.DESCRIBE_TRANSACTIONS, 0, 0)
async def describe_transactions(ctx: RequestContext, request):
    c = coordinator(ctx)
    states = []
    for tid in request.transactional_ids:
        empty = dict(transactional_id=tid, transaction_state="", transaction_timeout_ms=0,
                     transaction_start_time_ms=-1, producer_id=-1, producer_epoch=-1, topics=[])
        if not allowed(ctx, AclOperation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, tid):
            states.append(DT.TransactionState(error_code=ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, **empty))
            continue
        meta = c.txns.get(tid)
        if meta is None:
            states.append(DT.TransactionState(error_code=ErrorCode.TRANSACTIONAL_ID_NOT_FOUND, **empty))
            continue
        by_topic: dict[str, list[int]] = {}
        for t, p in sorted(meta.partitions):
            by_topic.setdefault(t, []).append(p)
        states.append(DT.TransactionState(
            error_code=0, transactional_id=tid, transaction_state=meta.state,
            transaction_timeout_ms=meta.timeout_ms, transaction_start_time_ms=meta.start_ms,
            producer_id=meta.producer_id, producer_epoch=meta.producer_epoch,
            topics=[DT.TransactionState.TopicData(topic=t, partitions=ps) for t, ps in by_topic.items()]))
    return ctx.response(throttle_time_ms=0, transaction_states=states)


@handles(ApiKey.LIST_TRANSACTIONS, 0, 2)
async def list_transactions(ctx: RequestContext, request):
    c = coordinator(ctx)
    state_filters = set(request.state_filters or [])
    unknown = [s for s in state_filters if s not in STATES]
    pids = set(request.producer_id_filters or [])
    duration = request.duration_filter if ctx.version >= 1 else -1
    pattern = request.transactional_id_pattern if ctx.version >= 2 else None
    try:
        regex = re.compile(pattern) if pattern else None
    except re.error:
        return ctx.response(throttle_time_ms=0, error_code=ErrorCode.INVALID_REQUEST,
                            unknown_state_filters=[], transaction_states=[])
    from fluvial.broker.transactions import now_ms
    now = now_ms()
    out = []
    for tid, meta in sorted(c.txns.items()):
        if state_filters and meta.state not in state_filters:
            continue
        if pids and meta.producer_id not in pids:
            continue
        if duration is not None and duration >= 0 and (meta.start_ms < 0 or now - meta.start_ms < duration):
            continue
        if regex is not None and not regex.fullmatch(tid):
            continue
        if not allowed(ctx, AclOperation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, tid):
            continue
        out.append(LT.TransactionState(transactional_id=tid, producer_id=meta.producer_id,
                                       transaction_state=meta.state))
    return ctx.response(throttle_time_ms=0, error_code=0, unknown_state_filters=unknown, transaction_states=out)
