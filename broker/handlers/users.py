"""DescribeUserScramCredentials and AlterUserScramCredentials: users managed through Kafka's
own APIs (kafka-configs.sh --entity-type users, AdminClient.alter_user_scram_credentials).

As in Kafka: describing needs DESCRIBE on the CLUSTER resource and altering needs ALTER;
the client sends a salted password (it salts and hashes the password itself), so the
password never reaches the broker; a user's alterations in one request are applied all
together or not at all, and everything accepted is written in one durable change before
the answer.
"""
from __future__ import annotations

from collections import Counter

from fluvial.broker.authorization import allowed_on_cluster
from fluvial.broker.handlers import RequestContext, handles
from fluvial.protocol.errors import ErrorCode
from fluvial.protocol.messages import response_class
from fluvial.security import scram
from fluvial.security.acls import AclOperation
from fluvial.security.users import valid_user_name

DESCRIBE_USER_SCRAM_CREDENTIALS = 50
ALTER_USER_SCRAM_CREDENTIALS = 51

_DescribeResult = response_class(DESCRIBE_USER_SCRAM_CREDENTIALS).DescribeUserScramCredentialsResult
_AlterResult = response_class(ALTER_USER_SCRAM_CREDENTIALS).AlterUserScramCredentialsResult


def _describe_result(user: str, store, code: int = ErrorCode.NONE, message: str | None = None):
    infos = []
    if code == ErrorCode.NONE:
        for mech, cred in sorted(store.credentials(user).items()):
            infos.append(_DescribeResult.CredentialInfo(mechanism=scram.MECHANISMS[mech][1],
                                                        iterations=cred.iterations))
    return _DescribeResult(user=user, error_code=code, error_message=message, credential_infos=infos)


@handles(DESCRIBE_USER_SCRAM_CREDENTIALS, 0, 0)
async def describe_user_scram_credentials(ctx: RequestContext, request):
    if not allowed_on_cluster(ctx, AclOperation.DESCRIBE):
        return ctx.response(throttle_time_ms=0, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                            error_message="Cluster authorization failed: DESCRIBE on the cluster is needed",
                            results=[])
    store = ctx.broker.users
    if not request.users:
        results = [_describe_result(name, store) for name in store.names()]
        return ctx.response(throttle_time_ms=0, error_code=0, error_message=None, results=results)
    counts = Counter(u.name for u in request.users)
    results, seen = [], set()
    for u in request.users:
        if u.name in seen:
            continue
        seen.add(u.name)
        if counts[u.name] > 1:
            results.append(_describe_result(u.name, store, ErrorCode.DUPLICATE_RESOURCE,
                                            "Cannot describe SCRAM credentials for the same user twice in a "
                                            "single request"))
        elif u.name not in store:
            results.append(_describe_result(u.name, store, ErrorCode.RESOURCE_NOT_FOUND,
                                            "Attempt to describe a user credential that does not exist"))
        else:
            results.append(_describe_result(u.name, store))
    return ctx.response(throttle_time_ms=0, error_code=0, error_message=None, results=results)


@handles(ALTER_USER_SCRAM_CREDENTIALS, 0, 0)
async def alter_user_scram_credentials(ctx: RequestContext, request):
    users_in_order: list[str] = []
    for item in [*request.deletions, *request.upsertions]:
        if item.name not in users_in_order:
            users_in_order.append(item.name)
    if not allowed_on_cluster(ctx, AclOperation.ALTER):
        return ctx.response(throttle_time_ms=0, results=[
            _AlterResult(user=u, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                         error_message="Cluster authorization failed: ALTER on the cluster is needed")
            for u in users_in_order])
    store = ctx.broker.users
    errors: dict[str, tuple[int, str]] = {}

    def fail(user: str, code: int, message: str) -> None:
        errors.setdefault(user, (code, message))

    pairs = Counter((i.name, i.mechanism) for i in [*request.deletions, *request.upsertions])
    for (user, _mech), n in pairs.items():
        if n > 1:
            fail(user, ErrorCode.DUPLICATE_RESOURCE, "A user credential cannot be altered twice in the same request")
    deletions, upserts = [], []
    for d in request.deletions:
        mech = scram.MECHANISM_BY_CODE.get(d.mechanism)
        if not d.name:
            fail(d.name, ErrorCode.UNACCEPTABLE_CREDENTIAL, "Username must not be empty")
        elif mech is None:
            fail(d.name, ErrorCode.UNSUPPORTED_SASL_MECHANISM, f"Unknown SCRAM mechanism (code {d.mechanism})")
        elif store.credential(d.name, mech) is None:
            fail(d.name, ErrorCode.RESOURCE_NOT_FOUND, "Attempt to delete a user credential that does not exist")
        else:
            deletions.append((d.name, mech))
    for u in request.upsertions:
        mech = scram.MECHANISM_BY_CODE.get(u.mechanism)
        if not u.name:
            fail(u.name, ErrorCode.UNACCEPTABLE_CREDENTIAL, "Username must not be empty")
        elif not valid_user_name(u.name):
            fail(u.name, ErrorCode.UNACCEPTABLE_CREDENTIAL, "Username must be 1 to 255 printable characters")
        elif mech is None:
            fail(u.name, ErrorCode.UNSUPPORTED_SASL_MECHANISM, f"Unknown SCRAM mechanism (code {u.mechanism})")
        elif u.iterations < scram.MIN_ITERATIONS:
            fail(u.name, ErrorCode.UNACCEPTABLE_CREDENTIAL, f"Too few iterations (at least {scram.MIN_ITERATIONS})")
        elif u.iterations > scram.MAX_ITERATIONS:
            fail(u.name, ErrorCode.UNACCEPTABLE_CREDENTIAL, f"Too many iterations (at most {scram.MAX_ITERATIONS})")
        elif not u.salt or not u.salted_password:
            fail(u.name, ErrorCode.UNACCEPTABLE_CREDENTIAL, "Salt and salted password must not be empty")
        else:
            upserts.append((u.name, scram.credential_from_salted(mech, bytes(u.salt), bytes(u.salted_password),
                                                                 u.iterations)))
    # A user with any refused alteration keeps all its credentials as they were.
    deletions = [d for d in deletions if d[0] not in errors]
    upserts = [u for u in upserts if u[0] not in errors]
    if deletions or upserts:
        try:
            await store.apply_async(upserts, deletions, ctx.broker.io_executor)
        except OSError as exc:
            for user, _ in [*deletions, *upserts]:
                fail(user, ErrorCode.UNKNOWN_SERVER_ERROR, f"could not store the credentials: {exc}")
    return ctx.response(throttle_time_ms=0, results=[
        _AlterResult(user=user, error_code=errors.get(user, (0, None))[0], error_message=errors.get(user, (0, None))[1])
        for user in users_in_order])




DESCRIBE_CLIENT_QUOTAS = 48


@handles(DESCRIBE_CLIENT_QUOTAS, 0, 1)
async def describe_client_quotas(ctx: RequestContext, request):
    """Fluvial enforces no client quotas, so none is ever described. Served because Kafka's
    `kafka-configs.sh --describe --entity-type users` asks for a user's quotas together with
    its SCRAM credentials and fails if the API is missing. Needs DESCRIBE_CONFIGS on the
    cluster, as in Kafka."""
    if not allowed_on_cluster(ctx, AclOperation.DESCRIBE_CONFIGS):
        return ctx.response(throttle_time_ms=0, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                            error_message="Cluster authorization failed: DESCRIBE_CONFIGS on the cluster is needed",
                            entries=None)
    return ctx.response(throttle_time_ms=0, error_code=0, error_message=None, entries=[])
