"""Schemathesis hooks for test_conformance.py: the served model's name in
every generated body, and a check that every 4xx names its cause in
OpenAI's error shape."""

import schemathesis

MODEL = "test-model"


@schemathesis.hook
def map_body(ctx, body):
    if isinstance(body, dict) and "model" in body:
        body["model"] = MODEL
    return body


ANTHROPIC_ERRORS = {
    "invalid_request_error", "authentication_error", "permission_error", "not_found_error",
    "request_too_large", "rate_limit_error", "api_error", "overloaded_error",
}


def on_messages_route(case):
    """The Messages routes (plain and under a trajectory prefix) answer
    errors in Anthropic's shape."""
    path = case.operation.path
    return path.endswith("/v1/messages") or path.endswith("/v1/messages/count_tokens")


def check_anthropic_error(response):
    try:
        body = response.json()
    except ValueError:
        raise AssertionError(f"{response.status_code} with a body that is not JSON: {response.text[:300]!r}")
    err = body.get("error") if isinstance(body, dict) else None
    if not (isinstance(body, dict) and set(body) == {"type", "error"} and body["type"] == "error"
            and isinstance(err, dict) and set(err) == {"type", "message"}):
        raise AssertionError(f"{response.status_code} not in Anthropic's error shape: {body}")
    if err["type"] not in ANTHROPIC_ERRORS or not (isinstance(err["message"], str) and err["message"].strip()):
        raise AssertionError(f"{response.status_code} without a known type and a message: {body}")


@schemathesis.check
def error_names_its_cause(ctx, response, case):
    if 400 <= response.status_code < 500:
        body = response.json()
        err = body.get("error") if isinstance(body, dict) else None
        message = err.get("message") if isinstance(err, dict) else None
        if not (isinstance(message, str) and message.strip()):
            raise AssertionError(f"{response.status_code} without error.message: {body}")


@schemathesis.check
def error_in_openai_shape(ctx, response, case):
    """tito's own document: every error, 4xx or 5xx, whether documented
    for the operation or not, is exactly OpenAI's error body (Anthropic's
    on the Messages routes)."""
    if response.status_code < 400:
        return
    if on_messages_route(case):
        check_anthropic_error(response)
        return
    try:
        body = response.json()
    except ValueError:
        raise AssertionError(f"{response.status_code} with a body that is not JSON: {response.text[:300]!r}")
    err = body.get("error") if isinstance(body, dict) else None
    if not (isinstance(body, dict) and set(body) == {"error"} and isinstance(err, dict)):
        raise AssertionError(f"{response.status_code} not in OpenAI's error shape: {body}")
    if set(err) != {"message", "type", "param", "code"}:
        raise AssertionError(f"{response.status_code} error fields {sorted(err)}: {body}")
    if not (isinstance(err["message"], str) and err["message"].strip() and isinstance(err["type"], str)):
        raise AssertionError(f"{response.status_code} without a message and type: {body}")
    if not all(err[k] is None or isinstance(err[k], str) for k in ("param", "code")):
        raise AssertionError(f"{response.status_code} param / code neither string nor null: {body}")
