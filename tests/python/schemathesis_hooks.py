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


@schemathesis.check
def error_names_its_cause(ctx, response, case):
    if 400 <= response.status_code < 500:
        body = response.json()
        err = body.get("error") if isinstance(body, dict) else None
        message = err.get("message") if isinstance(err, dict) else None
        if not (isinstance(message, str) and message.strip()):
            raise AssertionError(f"{response.status_code} without error.message: {body}")
