"""SaslHandshake and SaslAuthenticate on a listener without SASL.

On a SASL listener these requests never reach the handlers: the connection's gate
(security/sasl.py) answers them. Registered here so that ApiVersions advertises them on
every listener, as Kafka does; on a PLAINTEXT or SSL listener Kafka answers both with
ILLEGAL_SASL_STATE.
"""
from __future__ import annotations

from fluvial.broker.handlers import RequestContext, handles
from fluvial.protocol.errors import ErrorCode
from fluvial.protocol.messages import ApiKey


@handles(ApiKey.SASL_HANDSHAKE, 0, 1)
async def sasl_handshake(ctx: RequestContext, request):
    return ctx.response(error_code=ErrorCode.ILLEGAL_SASL_STATE, mechanisms=[])


@handles(ApiKey.SASL_AUTHENTICATE, 0, 2)
async def sasl_authenticate(ctx: RequestContext, request):
    fields = dict(error_code=ErrorCode.ILLEGAL_SASL_STATE,
                  error_message="SASL is not enabled on this listener (security.protocol has no SASL)",
                  auth_bytes=b"")
    if ctx.version >= 1:
        fields["session_lifetime_ms"] = 0
    return ctx.response(**fields)
